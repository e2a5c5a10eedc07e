"""DP (Galvatron-BMW) search time on the 2-core machine, max-throughput objective.

gpt-7.5b on 8 and 64 GPUs (A100-80GB), llama-2-70b on 1024 (128 nodes x 8 H100-80GB), llama-3-405b
on 16384 H100-80GB; one sample per GPU per step. Times the DP search itself (graph building, block
pricing, every candidate's DPs, whole-plan evaluation of the candidates), then the whole
``parplan plan --search dp`` request (``planner.solve``: the baselines, the search with its Pareto
ladder, the document), and gives the search's work counts (``solver.work``).
Run: python bench/search_speed.py [model@gpus ...]
"""

from __future__ import annotations

import sys
import time

from _common import header

from parplan.solver.calibration import DEFAULT_CALIBRATION
from parplan.solver.cluster import make_cluster
from parplan.solver.dp.search import search
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.presets import get_preset
from parplan.solver.planner import solve
from parplan.solver.request import parse_plan_request

CASES = [("gpt-7.5b", 8, "A100-80GB"), ("gpt-7.5b", 64, "A100-80GB"), ("llama-2-70b", 1024, "H100-80GB"),
         ("llama-3-405b", 16384, "H100-80GB")]
WORK = ("candidates", "stage_tables", "stage_solves", "unit_pricings", "plan_evaluations", "baseline_evaluations")


def main() -> None:
    only = set(sys.argv[1:])
    print(header("DP search speed"))
    print("| model | GPUs | GPU | search s | plan s | candidates | step s | peak GiB | plan | work (solve) |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---|---|")
    for model, gpus, gpu in CASES:
        if only and f"{model}@{gpus}" not in only:
            continue
        cfg = get_preset(model)
        cluster = make_cluster(gpus, 8, gpu)
        t0 = time.perf_counter()
        res = search(lambda b, cfg=cfg: build_graph(cfg, batch=b), cluster, global_batch=gpus,
                     objective="max-throughput", budget_bytes=cluster.device_memory_bytes, max_slowdown=0.1,
                     alpha_gib_per_s=None, calibration=DEFAULT_CALIBRATION, timeout_seconds=600)
        secs = time.perf_counter() - t0
        plan = res.plan
        kinds = sorted({s.describe() for s in plan.layers.values()})
        # the whole request, as `parplan plan --search dp --objective max-throughput` makes it
        body = {"model": {"preset": model}, "cluster": {"gpus": gpus, "gpus_per_node": 8, "gpu": gpu},
                "training": {"global_batch": gpus}, "objective": {"kind": "max-throughput"}, "search": "dp",
                "time_limit": 600}
        t1 = time.perf_counter()
        doc = solve(parse_plan_request(body))
        plan_secs = time.perf_counter() - t1
        work = doc["solver"].get("work", {})
        print(f"| {model} | {gpus} | {gpu} | {secs:.2f} | {plan_secs:.2f} | {res.candidates} | "
              f"{res.step_seconds:.3f} | {res.peak_bytes / 2**30:.1f} | pp{plan.pp}, "
              f"{plan.num_microbatches} micro-batches: {'; '.join(kinds)} | "
              f"{', '.join(f'{k} {work[k]}' for k in WORK if k in work)} |", flush=True)


if __name__ == "__main__":
    main()

"""ILP solve time (model building included): GPT-7.5B on 8 A100-80GB, llama-2-70b on 64.

Times the ILP search alone (graph building, auxiliary problems, every solve, extraction and
certificate) and the whole plan request (baselines included).
Run: python bench/ilp_solve_time.py
"""

from __future__ import annotations

import time

from _common import header

from parplan.solver.calibration import DEFAULT_CALIBRATION
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.presets import get_preset
from parplan.solver.ilp.search import search
from parplan.solver.planner import solve
from parplan.solver.request import parse_plan_request

CASES = [("gpt-7.5b", 8, 64), ("llama-2-70b", 64, 128)]


def main() -> None:
    print(header("ILP solve time"))
    print("| model | GPUs | objective | ILP search s | status | gap | whole plan request s | plan |")
    print("|---|---:|---|---:|---|---:|---:|---|")
    for model, gpus, batch in CASES:
        for objective in ("max-throughput", "min-memory"):
            body = {"model": {"preset": model}, "cluster": {"gpus": gpus, "gpus_per_node": 8, "gpu": "A100-80GB"},
                    "training": {"global_batch": batch}, "objective": {"kind": objective}, "search": "ilp",
                    "time_limit": 300}
            req = parse_plan_request(body)
            cfg = get_preset(model)
            t0 = time.perf_counter()
            doc = search(lambda b, cfg=cfg: build_graph(cfg, batch=b), req.cluster, global_batch=batch,
                         micro_batch=None, objective=objective, budget_bytes=req.budget_bytes, max_slowdown=0.1,
                         alpha_gib_per_s=None, calibration=DEFAULT_CALIBRATION, timeout_seconds=300).to_document()
            ilp = time.perf_counter() - t0
            t1 = time.perf_counter()
            full = solve(req)
            whole = time.perf_counter() - t1
            gap = doc["solver"]["gap"]
            print(f"| {model} | {gpus} | {objective} | {ilp:.2f} | {doc['solver']['status']} | "
                  f"{gap if gap is None else f'{gap:.1e}'} | {whole:.2f} | {full['strategy']['summary']} |")


if __name__ == "__main__":
    main()

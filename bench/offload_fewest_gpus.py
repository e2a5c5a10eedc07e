"""Optimizer offloading: the fewest GPUs a target fits on with it and without, and the predicted slowdown.

For each case, ``parplan plan --target T --objective max-throughput`` (through the library) at growing
GPU counts (whole nodes past one), once with the search's optimizer offloading off
(``training.optimizer_offload: false``) and once on (the default: tried only when nothing fits
without). The slowdown compares the step at the fewest GPUs with offloading and at the fewest
without; per GPU it weighs each by its GPU count (GPU-seconds per step).
Run: python bench/offload_fewest_gpus.py
"""

from __future__ import annotations

from typing import Any

from _common import header

from parplan.solver.planner import solve
from parplan.solver.request import parse_plan_request

#: (model, GPU preset, target, global batch)
CASES = [("llama-2-70b", "A100-80GB", "megatron", 64), ("llama-2-70b", "H100-80GB", "megatron", 64),
         ("llama-2-13b", "A100-40GB", "deepspeed", 32)]
GPU_COUNTS = (1, 2, 4, 8, 16, 32, 64)


def plan(model: str, gpu: str, target: str, batch: int, gpus: int, offload: bool) -> dict[str, Any]:
    body = {"model": {"preset": model}, "cluster": {"gpus": gpus, "gpu": gpu},
            "training": {"global_batch": batch, "optimizer_offload": offload},
            "objective": {"kind": "max-throughput"}, "target": target}
    return solve(parse_plan_request(body))


def fewest(model: str, gpu: str, target: str, batch: int, offload: bool) -> tuple[int, dict[str, Any]] | None:
    for gpus in GPU_COUNTS:
        if batch % gpus and target == "deepspeed":
            continue
        doc = plan(model, gpu, target, batch, gpus, offload)
        if doc.get("strategy") is not None:
            return gpus, doc
    return None


def main() -> None:
    print(header("Optimizer offloading: fewest GPUs that fit, with and without"))
    print("| case | fewest GPUs without | plan | step s | fewest GPUs with | plan | step s | host GiB per machine "
          "| slowdown (step) | GPU-seconds ratio |")
    print("|---|---:|---|---:|---:|---|---:|---:|---:|---:|")
    for model, gpu, target, batch in CASES:
        case = f"{model} on {gpu}, target {target}, global batch {batch}"
        without, with_ = fewest(model, gpu, target, batch, False), fewest(model, gpu, target, batch, True)
        if without is None or with_ is None:
            print(f"| {case} | {without and without[0]} | | | {with_ and with_[0]} | | | | | |")
            continue
        (n0, d0), (n1, d1) = without, with_
        t0, t1 = d0["time"]["step_seconds"], d1["time"]["step_seconds"]
        host = d1["memory"].get("host_bytes_per_node")
        print(f"| {case} | {n0} | {d0['strategy']['summary']} | {t0:.2f} | {n1} | {d1['strategy']['summary']} | "
              f"{t1:.2f} | {host / 2**30 if host else 0:.0f} | {t1 / t0:.2f}x | {t1 * n1 / (t0 * n0):.2f} |")


if __name__ == "__main__":
    main()

"""Reproduce the structure of the memory-redundancy paper's Table 2 in parplan's cost model.

For BERT-Large, GPT-1.7B, GPT-3.6B and GPT-7.5B on 2, 4 and 8 A100-80GB GPUs (one node), the
per-device memory of parplan's min-memory ILP plan (step time within 10% of the best plan found,
baselines included) next to the Megatron-LM, ZeRO-3 and plain-DP baselines, the ratios (the
paper's "Relative" columns) and the plan's throughput relative to Megatron-LM, with solve times.
Global batch: 8 samples per GPU; sequence 512 (BERT) or 2048 (GPT).
Run: python bench/paper_table2.py [--time-limit SEC]
"""

from __future__ import annotations

import argparse
import time

from _common import header

from parplan.solver.planner import parse_plan_request, solve

#: The paper's Table 2, "Relative" to Megatron-LM (its memory / Megatron-LM's), for reference.
PAPER_RELATIVE_MLM = {
    ("bert-large", 2): 0.86, ("gpt-1.7b", 2): 0.73, ("gpt-3.6b", 2): 0.70, ("gpt-7.5b", 2): 0.54,
    ("bert-large", 4): 0.68, ("gpt-1.7b", 4): 0.34, ("gpt-3.6b", 4): 0.33, ("gpt-7.5b", 4): 0.42,
    ("bert-large", 8): 0.64, ("gpt-1.7b", 8): 0.71, ("gpt-3.6b", 8): 0.66, ("gpt-7.5b", 8): 0.63,
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--time-limit", type=float, default=120.0)
    args = ap.parse_args()
    print(header("Table 2 of the memory-redundancy paper, in parplan's cost model"))
    print("| model | GPUs | parplan GiB | Megatron GiB | ZeRO-3 GiB | DP GiB | vs MLM (paper) | vs ZeRO-3 | vs DP | "
          "throughput vs MLM | plan | solve s | status |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|")
    worst_ratio, worst_thr = 0.0, 9.0
    for gpus in (2, 4, 8):
        for model in ("bert-large", "gpt-1.7b", "gpt-3.6b", "gpt-7.5b"):
            body = {"model": {"preset": model}, "cluster": {"gpus": gpus, "gpus_per_node": 8, "gpu": "A100-80GB"},
                    "training": {"global_batch": 8 * gpus}, "objective": {"kind": "min-memory", "max_slowdown": 0.1},
                    "search": "ilp", "time_limit": args.time_limit}
            t0 = time.perf_counter()
            doc = solve(parse_plan_request(body))
            secs = time.perf_counter() - t0
            b = doc["baselines"]

            def gib(d: dict | None) -> str:  # type: ignore[type-arg]
                return f"{d['memory']['peak_bytes'] / 2**30:.1f}" + ("" if d.get("fits", True) else "*") if d else "-"

            if doc["memory"] is None:
                print(f"| {model} | {gpus} | no fit | {gib(b['megatron'])} | {gib(b['zero3'])} | {gib(b['dp'])} | "
                      f"| | | | {doc.get('message')} | {secs:.1f} | infeasible |")
                continue
            rel = doc["relative"]
            r_mlm = rel["megatron"]["memory"]
            worst_ratio = max(worst_ratio, r_mlm / PAPER_RELATIVE_MLM[(model, gpus)])
            worst_thr = min(worst_thr, rel["megatron"]["throughput"])
            print(f"| {model} | {gpus} | {doc['memory']['peak_bytes'] / 2**30:.1f} | {gib(b['megatron'])} | "
                  f"{gib(b['zero3'])} | {gib(b['dp'])} | {r_mlm:.2f} ({PAPER_RELATIVE_MLM[(model, gpus)]:.2f}) | "
                  f"{rel['zero3']['memory']:.2f} | {rel['dp']['memory']:.2f} | {rel['megatron']['throughput']:.2f} | "
                  f"{doc['strategy']['summary']} | {secs:.1f} | {doc['solver']['status']} |")
    print(f"\n(* = does not fit in 80 GiB.) Largest ratio to the paper's own Megatron-LM ratio: {worst_ratio:.2f} "
          f"(<= 1 means at or below the paper's); lowest throughput relative to Megatron-LM: {worst_thr:.2f}.")


if __name__ == "__main__":
    main()

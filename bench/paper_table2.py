"""Reproduce the structure of the memory-redundancy paper's Table 2 in parplan's cost model.

For BERT-Large, GPT-1.7B, GPT-3.6B and GPT-7.5B on 2, 4 and 8 A100-80GB GPUs (one node), the
per-device memory of parplan's min-memory plan from the ILP search (step time within 10% of the
fastest plan known, baselines included; a baseline when none beats it) next to the Megatron-LM,
ZeRO-3 and plain-DP baselines, the ratios (the paper's "Relative" columns) and the plan's
throughput relative to Megatron-LM, with solve times. Sequence 512 (BERT) or 2048 (GPT).

Issue 10's aim per cell: the ratio to Megatron-LM at or below the paper's, or, where the paper's
ratio is below the floor (the model states alone fully sharded, 18 bytes per parameter over the
GPUs), within 20% of that floor; throughput within 10% of Megatron-LM's.

The paper compares memory at Megatron-LM's throughput. Where the fastest plan known is faster than
Megatron-LM's fastest configuration (larger micro-batches run the GEMMs at a higher efficiency,
kernels.py), the default objective stays within 10% of that faster plan, which can take more memory
than Megatron-LM. The "at MLM's time" columns solve the same request again with the slowdown that
puts the limit at 1.1x Megatron-LM's step time (the paper's operating point), and apply the same aim.
Run: python bench/paper_table2.py [--global-batch 16 --global-batch 64] [--time-limit SEC]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from _common import header

from parplan.solver.planner import solve
from parplan.solver.request import parse_plan_request

#: The paper's Table 2, "Relative" to Megatron-LM (its memory / Megatron-LM's), for reference.
PAPER_RELATIVE_MLM = {
    ("bert-large", 2): 0.86, ("gpt-1.7b", 2): 0.73, ("gpt-3.6b", 2): 0.70, ("gpt-7.5b", 2): 0.54,
    ("bert-large", 4): 0.68, ("gpt-1.7b", 4): 0.34, ("gpt-3.6b", 4): 0.33, ("gpt-7.5b", 4): 0.42,
    ("bert-large", 8): 0.64, ("gpt-1.7b", 8): 0.71, ("gpt-3.6b", 8): 0.66, ("gpt-7.5b", 8): 0.63,
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--time-limit", type=float, default=120.0)
    ap.add_argument("--global-batch", type=int, action="append", help="samples per step (repeat for several)")
    args = ap.parse_args()
    for batch in args.global_batch or [16, 64]:
        table(batch, args.time_limit)


def table(batch: int, time_limit: float) -> None:
    print(header(f"Table 2 of the memory-redundancy paper, in parplan's cost model, global batch {batch}"))
    print("| model | GPUs | parplan GiB | Megatron GiB | ZeRO-3 GiB | DP GiB | vs MLM (paper) | floor GiB | aim | "
          "vs ZeRO-3 | vs DP | throughput vs MLM | plan | solve s | status | at MLM's time: GiB, vs MLM, "
          "throughput, aim |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|---:|---|---|")
    worst_ratio, worst_thr, met, met_at = 0.0, 9.0, 0, 0
    for gpus in (2, 4, 8):
        for model in ("bert-large", "gpt-1.7b", "gpt-3.6b", "gpt-7.5b"):
            body = {"model": {"preset": model}, "cluster": {"gpus": gpus, "gpus_per_node": 8, "gpu": "A100-80GB"},
                    "training": {"global_batch": batch}, "objective": {"kind": "min-memory", "max_slowdown": 0.1},
                    "search": "ilp", "time_limit": time_limit}
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
            paper = PAPER_RELATIVE_MLM[(model, gpus)]
            worst_ratio = max(worst_ratio, r_mlm / paper)
            thr = rel["megatron"]["throughput"]
            worst_thr = min(worst_thr, thr)
            peak = doc["memory"]["peak_bytes"]
            floor = 18 * doc["model"]["parameters"] / gpus
            below_floor = paper * b["megatron"]["memory"]["peak_bytes"] < floor
            ok, aim = _aim(r_mlm, peak, thr, paper, floor, below_floor)
            met += ok
            at = _at_megatron_time(body, doc)
            if at is None:
                at_text = "same plan"
                met_at += ok
            else:
                r_at, t_at = at["relative"]["megatron"]["memory"], at["relative"]["megatron"]["throughput"]
                ok_at, aim_at = _aim(r_at, at["memory"]["peak_bytes"], t_at, paper, floor, below_floor)
                met_at += ok_at
                at_text = f"{at['memory']['peak_bytes'] / 2**30:.1f}, {r_at:.2f}, {t_at:.2f}, {aim_at}"
            print(f"| {model} | {gpus} | {peak / 2**30:.1f} | {gib(b['megatron'])} | {gib(b['zero3'])} | "
                  f"{gib(b['dp'])} | {r_mlm:.2f} ({paper:.2f}) | {floor / 2**30:.1f} | {aim} | "
                  f"{rel['zero3']['memory']:.2f} | {rel['dp']['memory']:.2f} | {thr:.2f} | "
                  f"{doc['strategy']['summary']} | {secs:.1f} | {doc['solver']['status']} | {at_text} |")
    print(f"\n(* = does not fit in 80 GiB.) Aim met in {met} of 12 cells (at Megatron-LM's time: {met_at} of 12). "
          f"Largest ratio to the paper's own "
          f"Megatron-LM ratio: {worst_ratio:.2f} (<= 1 means at or below the paper's); lowest throughput relative to "
          f"Megatron-LM: {worst_thr:.2f}.\n")


def _aim(ratio: float, peak: float, throughput: float, paper: float, floor: float,
         below_floor: bool) -> tuple[bool, str]:
    """Whether a cell meets issue 10's aim (module docstring), and how it reads."""
    ok = (ratio <= paper * (1 + 1e-9) or (below_floor and peak <= 1.2 * floor)) and throughput >= 0.9
    return ok, ("met" if ok else "missed") + (" (floor)" if below_floor and ratio > paper else "")


def _at_megatron_time(body: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any] | None:
    """The same request solved with the slowdown that puts its time limit at 1.1x Megatron-LM's step
    (None when the fastest plan known is not faster than Megatron-LM's: the default answer is it)."""
    mlm = doc["baselines"]["megatron"]
    fastest = doc["objective"].get("fastest_known_seconds")
    if not mlm or not fastest or fastest >= mlm["time"]["step_seconds"] * (1 - 1e-9):
        return None
    slowdown = 1.1 * mlm["time"]["step_seconds"] / fastest - 1
    again = dict(body, objective={"kind": "min-memory", "max_slowdown": slowdown})
    return solve(parse_plan_request(again))


if __name__ == "__main__":
    main()

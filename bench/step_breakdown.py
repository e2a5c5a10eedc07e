"""Issue 12: a measured training step, kernel category by kernel category, beside the time model's
prediction of each (bench/gpu_checks.py's ``breakdown`` part; parplan/agent/step_profile.py).

For each run of the part's file: the step's wall time (median of the unprofiled steps) against the
predicted step, then per phase (forward, backward with any recomputation, optimizer) the profiled
seconds of each category of kernels, the phase's span and the time its kernels ran (the rest is
the device idling between kernels: launch and host overhead, which the model does not price),
against :func:`parplan.solver.cost.breakdown.single_gpu_breakdown` for the same model, micro-batch
and recomputation on the run's GPU preset (runtime ``torch``: PyTorch's kernels; precision
``bf16-grad16``: bf16 weights and gradients, fp32 master weights and Adam, as the run trains).

Run: python bench/step_breakdown.py FILE [--gpu PRESET]   (FILE: a breakdown.json)
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from _common import header

from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.breakdown import CATEGORIES, PHASES, single_gpu_breakdown
from parplan.solver.cost.runtime import Runtime
from parplan.solver.frontends.config import TransformerConfig


def _ratio(predicted: float, measured: float) -> str:
    return f"{predicted / measured:.2f}" if measured > 0 else "-"


def table(run: dict[str, Any], gpu: str) -> list[str]:
    """Markdown lines comparing one run of the ``breakdown`` part with its prediction on ``gpu``."""
    cfg = TransformerConfig(**run["model"])
    pred = single_gpu_breakdown(cfg, int(run["micro_batch"]), int(run["seq_len"]), Recompute(run["recompute"]),
                                gpu, Runtime.TORCH, "bf16-grad16")
    measured = float(run["step_seconds"]["median"])
    lines = [f"**{run['label']}** ({run['dtype']}, attention kernel {run['attention_kernel']}): step "
             f"{measured:.4f} s measured, {pred.step_seconds:.4f} s predicted on {gpu} "
             f"(predicted / measured {_ratio(pred.step_seconds, measured)})", "",
             "| phase | category | measured s | predicted s | predicted / measured |",
             "|---|---|---:|---:|---:|"]
    for phase in PHASES:
        got = run["phases"][phase]
        for cat in CATEGORIES:
            m, p = float(got["categories"].get(cat, 0.0)), pred.phases[phase][cat]
            if m or p:
                lines.append(f"| {phase} | {cat} | {m:.5f} | {p:.5f} | {_ratio(p, m)} |")
        busy, window = float(got["busy_seconds"]), float(got["window_seconds"])
        lines.append(f"| {phase} | **kernels running** | {busy:.5f} | {pred.phase_seconds(phase):.5f} | "
                     f"{_ratio(pred.phase_seconds(phase), busy)} |")
        lines.append(f"| {phase} | idle between kernels | {max(window - busy, 0.0):.5f} | 0 | - |")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("--gpu", help="GPU preset to predict for (default: the one each run names)")
    args = ap.parse_args(argv)
    with open(args.file) as f:
        doc = json.load(f)
    print(header("A measured step by kernel category, against the time model (issue 12)"))
    print(f"data: {args.file}\n")
    for run in doc["result"]:
        if not run.get("ok"):
            print(f"**{run['label']}**: failed: {run.get('error', '')[-300:]}\n")
            continue
        gpu = args.gpu or run.get("gpu") or "H100-80GB"
        print("\n".join(table(run, gpu)))
        print("\ntop kernels (per step):\n")
        print("| phase | kernel | launched by | category | count | seconds |")
        print("|---|---|---|---|---:|---:|")
        for k in run["top_kernels"][:15]:
            print(f"| {k['phase']} | `{k['name'][:90]}` | {k['launched_by']} | {k['category']} | {k['count']} | "
                  f"{k['seconds']:.5f} |")
        print()


if __name__ == "__main__":
    main()

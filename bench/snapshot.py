"""The ``--json`` output of ``parplan memory`` and ``parplan plan`` on a fixed set of cases (every
runtime, the ILP, the DP, each target, MoE, CP, FP8, T5), written as one JSON file: to show that a
change to the solver moved no prediction. Wall-clock fields (a solver's seconds) are left out.

Run: python bench/snapshot.py OUT.json [--compare OTHER.json] [--only SUBSTRING]
With --compare, lists every case whose document differs from OTHER.json's beyond a relative 1e-9
(exit status 1 if any), with the first differing keys of each.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import sys
from typing import Any

from parplan.cli import main as parplan

# (label, arguments). Plans use small clusters so that every search solves to optimality quickly.
_MEM = ["memory", "--json"]
_PLAN = ["plan", "--json", "--time-limit", "120"]
CASES: list[tuple[str, list[str]]] = [
    ("memory/megatron/gpt-1.7b/tp2pp2", [*_MEM, "--model", "gpt-1.7b", "--gpus", "8", "--tp", "2", "--pp", "2",
                                         "--global-batch", "16"]),
    ("memory/megatron/gpt-7.5b/sp-zero1-full", [*_MEM, "--model", "gpt-7.5b", "--gpus", "16", "--tp", "4", "--pp",
                                                "2", "--zero", "1", "--sequence-parallel", "--recompute", "full",
                                                "--global-batch", "64"]),
    ("memory/megatron/llama-3-8b/interleaved", [*_MEM, "--model", "llama-3-8b", "--gpus", "16", "--tp", "2", "--pp",
                                                "4", "--schedule", "interleaved", "--virtual-stages", "2",
                                                "--global-batch", "32", "--gpu", "H100-80GB"]),
    ("memory/megatron/gpt-1.7b/gpipe-noflash", [*_MEM, "--model", "gpt-1.7b", "--gpus", "4", "--tp", "1", "--pp",
                                                "4", "--schedule", "gpipe", "--no-flash-attention",
                                                "--recompute", "none", "--global-batch", "8"]),
    ("memory/torch/llama-3-8b/fsdp", [*_MEM, "--model", "llama-3-8b", "--gpus", "8", "--tp", "1", "--pp", "1",
                                      "--zero", "3", "--runtime", "torch", "--global-batch", "16"]),
    ("memory/torch-cpu/gpt-1.7b/tp2-zero3", [*_MEM, "--model", "gpt-1.7b", "--gpus", "8", "--tp", "2", "--pp", "1",
                                             "--zero", "3", "--sequence-parallel", "--runtime", "torch-cpu"]),
    ("memory/interpreter-cpu/gpt-1.7b/tp2", [*_MEM, "--model", "gpt-1.7b", "--gpus", "4", "--tp", "2", "--pp", "1",
                                             "--runtime", "interpreter-cpu"]),
    ("memory/deepspeed/llama-2-7b/zero2", [*_MEM, "--model", "llama-2-7b", "--gpus", "8", "--tp", "1", "--pp", "1",
                                           "--zero", "2", "--runtime", "deepspeed", "--global-batch", "32"]),
    ("memory/deepspeed/llama-2-7b/zero3-accum", [*_MEM, "--model", "llama-2-7b", "--gpus", "8", "--tp", "1", "--pp",
                                                 "1", "--zero", "3", "--runtime", "deepspeed", "--micro-batch", "2",
                                                 "--global-batch", "64"]),
    ("memory/torchtitan/llama-3-8b/fsdp-accum", [*_MEM, "--model", "llama-3-8b", "--gpus", "8", "--tp", "1", "--pp",
                                                 "1", "--zero", "3", "--runtime", "torchtitan", "--global-batch",
                                                 "32", "--gpu", "H100-80GB"]),
    ("memory/torchtitan/llama-3-70b/tp-pp", [*_MEM, "--model", "llama-3-70b", "--gpus", "64", "--tp", "8", "--pp",
                                             "2", "--zero", "3", "--sequence-parallel", "--runtime", "torchtitan",
                                             "--recompute", "full", "--global-batch", "64", "--gpu", "H100-80GB"]),
    ("memory/torchtitan-cpu/gpt-1.7b/fsdp", [*_MEM, "--model", "gpt-1.7b", "--gpus", "4", "--tp", "1", "--pp", "1",
                                             "--zero", "3", "--runtime", "torchtitan-cpu", "--global-batch", "8"]),
    ("memory/moe/mixtral-8x7b/ep", [*_MEM, "--model", "mixtral-8x7b", "--gpus", "32", "--tp", "2", "--pp", "2",
                                    "--expert-parallel", "8", "--zero", "1", "--sequence-parallel",
                                    "--global-batch", "64", "--gpu", "H100-80GB"]),
    ("memory/cp/llama-3-8b/cp2-p2p", [*_MEM, "--model", "llama-3-8b", "--gpus", "8", "--tp", "2", "--pp", "1",
                                      "--cp", "2", "--seq-len", "16384", "--sequence-parallel",
                                      "--global-batch", "8"]),
    ("memory/cp/llama-3-8b/cp2-a2a", [*_MEM, "--model", "llama-3-8b", "--gpus", "8", "--tp", "2", "--pp", "1",
                                      "--cp", "2", "--cp-comm", "a2a", "--seq-len", "16384",
                                      "--sequence-parallel", "--global-batch", "8"]),
    ("memory/fp8/llama-3-8b", [*_MEM, "--model", "llama-3-8b", "--gpus", "8", "--tp", "2", "--pp", "1", "--zero",
                               "1", "--sequence-parallel", "--precision", "fp8", "--gpu", "H100-80GB"]),
    ("memory/fp16-grad16/gpt-3.6b", [*_MEM, "--model", "gpt-3.6b", "--gpus", "8", "--tp", "2", "--pp", "2",
                                     "--precision", "fp16-grad16", "--global-batch", "32"]),
    ("memory/t5/t5-11b", [*_MEM, "--model", "t5-11b", "--gpus", "16", "--tp", "4", "--pp", "1", "--zero", "1",
                          "--global-batch", "16"]),
    ("memory/bert-large", [*_MEM, "--model", "bert-large", "--gpus", "4", "--tp", "1", "--pp", "1",
                           "--global-batch", "32"]),
    ("plan/auto/gpt-1.7b/8", [*_PLAN, "--model", "gpt-1.7b", "--gpus", "8", "--gpus-per-node", "8"]),
    ("plan/ilp/gpt-1.7b/8", [*_PLAN, "--model", "gpt-1.7b", "--gpus", "8", "--gpus-per-node", "8", "--search", "ilp"]),
    ("plan/ilp/bert-large/4-throughput", [*_PLAN, "--model", "bert-large", "--gpus", "4", "--search", "ilp",
                                          "--objective", "max-throughput"]),
    ("plan/dp/gpt-7.5b/32", [*_PLAN, "--model", "gpt-7.5b", "--gpus", "32", "--gpus-per-node", "8", "--search",
                             "dp", "--global-batch", "64"]),
    ("plan/dp/llama-3-8b/16-alpha", [*_PLAN, "--model", "llama-3-8b", "--gpus", "16", "--search", "dp", "--alpha",
                                     "2", "--gpu", "H100-80GB", "--global-batch", "32"]),
    ("plan/target-megatron/llama-3-8b/16", [*_PLAN, "--model", "llama-3-8b", "--gpus", "16", "--target", "megatron",
                                            "--gpu", "H100-80GB", "--global-batch", "32"]),
    ("plan/target-torchtitan/llama-3-8b/16", [*_PLAN, "--model", "llama-3-8b", "--gpus", "16", "--target",
                                              "torchtitan", "--gpu", "H100-80GB", "--global-batch", "32"]),
    ("plan/target-deepspeed/llama-2-7b/8", [*_PLAN, "--model", "llama-2-7b", "--gpus", "8", "--target", "deepspeed",
                                            "--global-batch", "32"]),
    ("plan/target-galvatron/gpt-3.6b/16", [*_PLAN, "--model", "gpt-3.6b", "--gpus", "16", "--target", "galvatron",
                                           "--global-batch", "32"]),
    ("plan/target-parplan/gpt-1.7b/8", [*_PLAN, "--model", "gpt-1.7b", "--gpus", "8", "--target", "parplan"]),
    ("plan/moe/mixtral-8x7b/32", [*_PLAN, "--model", "mixtral-8x7b", "--gpus", "32", "--gpu", "H100-80GB",
                                  "--global-batch", "64"]),
    ("plan/fp8/llama-3-8b/8", [*_PLAN, "--model", "llama-3-8b", "--gpus", "8", "--precision", "fp8", "--gpu",
                               "H100-80GB", "--global-batch", "16"]),
    ("plan/t5/t5-11b/16", [*_PLAN, "--model", "t5-11b", "--gpus", "16", "--global-batch", "32"]),
    ("plan/long-seq/llama-3-8b/16", [*_PLAN, "--model", "llama-3-8b", "--gpus", "16", "--seq-len", "32768",
                                     "--gpu", "H100-80GB", "--global-batch", "16"]),
]

#: keys under ``solver`` whose values are wall-clock measurements of this run, not predictions
_WALL_CLOCK = {"seconds", "ilp_seconds", "search_seconds", "solve_seconds"}


def _strip_wall_clock(doc: Any, in_solver: bool = False) -> Any:
    if isinstance(doc, dict):
        return {k: _strip_wall_clock(v, in_solver or k == "solver") for k, v in doc.items()
                if not (in_solver and k in _WALL_CLOCK)}
    if isinstance(doc, list):
        return [_strip_wall_clock(v, in_solver) for v in doc]
    return doc


def run_case(args: list[str]) -> Any:
    """The case's JSON document, or ``{"exit": N, "stderr": ...}`` when the command fails."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = parplan(args)
    if code != 0:
        return {"exit": code, "stderr": err.getvalue().strip()}
    return _strip_wall_clock(json.loads(out.getvalue()))


def differences(a: Any, b: Any, where: str = "", rel: float = 1e-9) -> list[str]:
    """Paths at which ``a`` and ``b`` differ (numbers beyond the relative tolerance ``rel``)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{where}.{k}: only in {'new' if k in a else 'old'}" for k in sorted(set(a) ^ set(b))]
        for k in sorted(set(a) & set(b)):
            out += differences(a[k], b[k], f"{where}.{k}", rel)
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where}: {len(a)} items against {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{where}[{i}]", rel)]
    both_numbers = all(isinstance(x, int | float) and not isinstance(x, bool) for x in (a, b))
    if both_numbers:
        if math.isclose(a, b, rel_tol=rel, abs_tol=0.0) or (a == b):
            return []
        return [f"{where}: {b!r} -> {a!r}"]
    return [] if a == b else [f"{where}: {b!r} -> {a!r}"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--compare", default=None)
    ap.add_argument("--only", default=None, help="run only the cases whose label contains this")
    args = ap.parse_args(argv)
    cases = [(label, a) for label, a in CASES if args.only is None or args.only in label]
    mine = {}
    for label, case_args in cases:
        mine[label] = run_case(case_args)
        print(f"{label}: {'exit ' + str(mine[label]['exit']) if 'exit' in mine[label] else 'ok'}", flush=True)
    with open(args.out, "w") as f:
        json.dump(mine, f, sort_keys=True, indent=1)
    print(f"{len(mine)} cases written to {args.out}")
    if not args.compare:
        return 0
    with open(args.compare) as f:
        other = json.load(f)
    differ = 0
    for label in mine:
        if label not in other:
            print(f"- {label}: not in {args.compare}")
            differ += 1
            continue
        diffs = differences(mine[label], other[label])
        if diffs:
            differ += 1
            print(f"- {label}: {len(diffs)} differences, first: " + "; ".join(diffs[:5]))
    print(f"{differ} of {len(mine)} cases differ from {args.compare}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())

"""G15 of the agent matrix: gloo keeps a finished all-gather's output alive after FSDP2 frees it.

The agent's CPU runs of FSDP2 ZeRO-3 over 4 gloo ranks without checkpointing measured, now and
then, a peak above the prediction (``gpt-tiny/zero3-dp4/none`` +3.9%, ``llama-tiny/zero3-dp4/none``
+4.8%, only with the 2 cores loaded). Two measurements of why:

1. ``gloo``: 4 gloo ranks run synchronous ``all_gather_into_tensor`` calls; after each returns,
   Python drops every reference to the output and a weakref finaliser on its storage tells whether
   the storage was freed at once. Each kept one is held by the backend (gloo's worker thread drops
   a finished work, and the tensors it references, only when it is next scheduled).
2. ``emulate``: the matrix specs (:data:`SPECS`), measured as the test measures them, first as they are, then
   with the gloo hold made deterministic: a wrapper of ``torch.distributed.all_gather_single`` (the
   call FSDP2 makes) keeps each call's tensors until the next call returns. Installed in the
   spawned ranks through a ``sitecustomize`` module on their ``PYTHONPATH``; the agent's code is
   not changed.

    .venv/bin/python bench/gloo_held_gathers.py [--calls 300] [--runs 1] [--out bench/out/gloo_held_gathers.txt]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
import tempfile
import weakref
from typing import Any

import torch
from _common import commit

#: FSDP2 ZeRO-3 without checkpointing: over 4, and over 2 with TP 2 (added 2026-11-29, after a CI run
#: measured ``llama-tiny/tp2-zero3-dp2-sp/none`` +3.48%)
SPECS = ("gpt-tiny/zero3-dp4/none", "llama-tiny/zero3-dp4/none", "gpt-tiny/tp2-zero3-dp2-sp/none",
         "llama-tiny/tp2-zero3-dp2-sp/none")
WORLD = 4
ELEMS = 200_000  # per rank: 0.8 MB fp32, a block's shard in the matrix is of that order

#: Installed in the ranks as ``sitecustomize`` (Python imports it at start-up) when emulating.
EMULATION = '''
import torch.distributed as _dist

_held = []
_orig = _dist.all_gather_single


def _all_gather_single(*args, **kwargs):
    work = _orig(*args, **kwargs)
    _held[:] = [x for x in list(args) + list(kwargs.values()) if hasattr(x, "untyped_storage")]
    return work


_dist.all_gather_single = _all_gather_single
'''


def _gloo_rank(rank: int, path: str, calls: int, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=WORLD)
    kept = 0
    for _ in range(calls):
        full = torch.empty(WORLD * ELEMS)
        dist.all_gather_into_tensor(full, full.narrow(0, rank * ELEMS, ELEMS))
        freed: list[int] = []
        storage = full.untyped_storage()
        weakref.finalize(storage, freed.append, 1)
        del full, storage
        kept += not freed
    dist.barrier()
    with open(f"{out}.{rank}", "w") as f:
        f.write(str(kept))
    dist.destroy_process_group()


def gloo_kept(calls: int) -> list[int]:
    """Per rank: how many of ``calls`` all-gather outputs outlived the call and Python's references."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "kept")
        mp.spawn(_gloo_rank, args=(os.path.join(d, "store"), calls, out), nprocs=WORLD)
        return [int(open(f"{out}.{r}").read()) for r in range(WORLD)]


def measure(runs: int, emulate: bool) -> dict[str, list[dict[str, Any]]]:
    from parplan.agent.matrix import all_specs
    from parplan.agent.validate import run_and_compare

    specs = [s for s in all_specs(full=True, timing_steps=1) if s.label in SPECS]
    before = os.environ.get("PYTHONPATH")
    with tempfile.TemporaryDirectory() as d:
        if emulate:
            with open(os.path.join(d, "sitecustomize.py"), "w") as f:
                f.write(EMULATION)
            os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (d, before) if p)
        try:
            results = run_and_compare(specs * runs, "cpu")
        finally:
            if before is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = before
    out: dict[str, list[dict[str, Any]]] = {}
    for s, r in zip(specs * runs, results, strict=True):
        out.setdefault(s.label, []).append({
            "predicted": r["ranks"][0]["predicted"]["peak_bytes"],
            "measured": [x["measured"]["peak_bytes"] for x in r["ranks"]],
            "error": r["most_loaded"]["relative_error"],
        })
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--out")
    args = ap.parse_args()
    lines = [
        "command: python bench/gloo_held_gathers.py " + " ".join(sys.argv[1:]),
        f"date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC",
        f"commit: {commit()}",
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"load average before {' '.join(f'{x:.2f}' for x in os.getloadavg())}, torch {torch.__version__}",
        "",
        f"1. gloo, {WORLD} ranks, {args.calls} synchronous all-gathers of {WORLD} x {ELEMS} fp32 each: outputs "
        "still alive after the call returned and Python dropped them, per rank:",
    ]
    kept = gloo_kept(args.calls)
    lines.append("   " + ", ".join(f"rank {r}: {k}/{args.calls} ({k / args.calls:.0%})" for r, k in enumerate(kept)))
    lines.append("")
    lines.append("2. the matrix specs, peak of each rank (bytes), as measured and with the hold made deterministic:")
    lines.append("")
    lines.append("| spec | predicted | as measured | error | gloo hold emulated | error | difference |")
    lines.append("|---|---:|---:|---:|---:|---:|---:|")
    plain, held = measure(args.runs, False), measure(args.runs, True)
    for label in SPECS:
        for a, b in zip(plain[label], held[label], strict=True):
            lines.append(f"| {label} | {a['predicted']:,} | {max(a['measured']):,} | {a['error']:+.2%} | "
                         f"{max(b['measured']):,} | {b['error']:+.2%} | {max(b['measured']) - max(a['measured']):+,} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()

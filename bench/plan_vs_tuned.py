"""Issue 51, point 6: parplan's plans against the best hand-tuned uniform Megatron-LM configuration.

For each case (a model preset, a GPU count and preset, a global batch) the *grid* is every uniform
configuration Megatron-LM accepts as parplan knows it: the ``megatron`` target's own enumeration
(:func:`parplan.solver.targets.runnable`: TP inside a node with or without sequence parallelism, PP
over equal layer counts, 1F1B or interleaved with 2 or 4 chunks per device, DP with or without the
distributed optimizer (ZeRO-1, with ``--overlap-param-gather``), expert parallelism for MoE models,
the recomputation modes the runtime searches, micro-batches 1, 2, 4 and 8), less the members whose
degrees do not divide what they split (:class:`parplan.solver.strategy.SplitDims`). Every member is
priced by the whole-plan evaluator under the ``megatron`` runtime
(:class:`parplan.solver.baselines.UniformEvaluator`, the path ``parplan memory`` takes), and the
fastest that fits the device's memory is the grid's best. It is set against the max-throughput
plans :func:`parplan.solver.planner.solve` returns for ``--target megatron`` and ``--target any``
(speedup: the grid's step time over the plan's).

Pruning (exact; neither rule can drop the best configuration):
- a member whose model states alone (:meth:`UniformEvaluator.states_floor`) exceed the device's
  memory cannot fit and is not priced;
- every other member's step time is priced; memory is priced in order of step time until the first
  member that fits (those after it are slower), and for the members exactly as fast (ties).

Fewest GPUs: the GPU counts 1, 2, 4, ... (one node of that many GPUs below the preset's node size,
whole nodes above), at the case's global batch, scanned upwards to the case's count; the first
count on which the grid (any member fits: memory priced in order of the model-states floor until
one fits or the floor passes the budget) or a solve's plan fits. The scan starts at the largest
power of two not above ``parameters x (weight + optimizer-state bytes) / device memory``: weights
and optimizer states are held for the whole step and stored at least once across the devices, so
the busiest device holds at least that share; the count below it is run as well, and must not fit.

Run: PYTHONPATH=. python bench/plan_vs_tuned.py [--quick]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from _common import header

from parplan.solver.baselines import Candidate, UniformEvaluator
from parplan.solver.cost.precision import get_precision
from parplan.solver.planner import solve
from parplan.solver.request import PlanRequest, parse_plan_request
from parplan.solver.strategy import SplitDims
from parplan.solver.targets import SPECS, Target, runnable

#: (model preset, GPUs, GPU preset, global batch in samples)
CASES = [("llama-3-8b", 8, "A100-80GB", 32), ("gpt-18.4b", 64, "H100-80GB", 256),
         ("mixtral-8x7b", 64, "H100-80GB", 128), ("llama-3-70b", 256, "H100-80GB", 512),
         ("mixtral-8x22b", 512, "B200-180GB", 1024), ("llama-2-70b", 1024, "A100-80GB", 1024),
         ("gpt3-175b", 2048, "B200-180GB", 1536), ("gpt-145.6b", 16384, "H100-80GB", 4096),
         ("llama-3-405b", 16384, "H100-80GB", 2048)]
QUICK = CASES[:1]


def request(model: str, gpus: int, gpu: str, global_batch: int, target: str) -> PlanRequest:
    per_node = 8 if gpus >= 8 else gpus
    return parse_plan_request({"model": {"preset": model},
                               "cluster": {"gpus": gpus, "gpus_per_node": per_node, "gpu": gpu},
                               "training": {"global_batch": global_batch},
                               "objective": {"kind": "max-throughput"}, "target": target})


@dataclass(frozen=True)
class Grid:
    """The grid of one case: its size, members pruned unpriced, and its best member that fits."""

    size: int
    pruned: int
    best: str | None
    step_seconds: float | None
    peak_gib: float | None


def members(req: PlanRequest) -> tuple[UniformEvaluator, list[Candidate]]:
    """The evaluator and the grid: the megatron target's configurations that split the model."""
    ev = UniformEvaluator(req.model, req.cluster, req.global_batch, req.seq_len, req.calibration,
                          precision=req.precision, runtime=SPECS[Target.MEGATRON].runtime)
    g = ev.graph(1)
    runs = runnable(Target.MEGATRON, req.cluster, req.global_batch, g)
    assert isinstance(runs, set)
    split = SplitDims.of(g)
    cands = sorted((c for c in runs if split.allows(c.tp, c.sp, c.ep)),
                   key=lambda c: (c.tp, c.pp, c.dp, c.zero, c.sp, c.recompute.value, c.micro_batch,
                                  c.schedule.value, c.virtual, c.ep))
    return ev, cands


def grid(req: PlanRequest) -> Grid:
    ev, cands = members(req)
    budget = req.budget_bytes
    timed: list[tuple[float, int]] = []
    pruned = 0
    for i, c in enumerate(cands):
        if ev.states_floor(c) > budget:
            pruned += 1
            continue
        t = ev.time_of(c)
        if t is not None:
            timed.append((t.step_seconds, i))
    timed.sort()
    best: tuple[float, float, int] | None = None  # (seconds, peak bytes, index)
    for secs, i in timed:
        if best is not None and secs > best[0]:
            break
        m = ev.memory_of(cands[i])
        if m is not None and m.peak_bytes <= budget and (best is None or (secs, m.peak_bytes) < best[:2]):
            best = (secs, m.peak_bytes, i)
    if best is None:
        return Grid(len(cands), pruned, None, None, None)
    e = ev.evaluation(cands[best[2]], ev.memory_of(cands[best[2]]), ev.time_of(cands[best[2]]))  # type: ignore[arg-type]
    return Grid(len(cands), pruned, e.strategy.describe(), best[0], best[1] / 2**30)


def grid_fits(req: PlanRequest) -> bool:
    """Whether any grid member fits (memory priced in order of the model-states floor)."""
    ev, cands = members(req)
    for c in sorted(cands, key=ev.states_floor):
        if ev.states_floor(c) > req.budget_bytes:
            return False
        m = ev.memory_of(c)
        if m is not None and m.peak_bytes <= req.budget_bytes:
            return True
    return False


def plan_fits(req: PlanRequest) -> bool:
    return solve(req)["memory"] is not None


def counts(model: str, gpus: int, gpu: str, global_batch: int, offload: bool = False) -> Iterable[int]:
    """The GPU counts scanned: powers of two up to ``gpus``, from the largest below the lower bound: the
    weights and optimizer states over the budget, the weights alone where the optimizer may be offloaded
    to the host (the targets' searches, :data:`parplan.solver.targets.OFFLOAD_FRACTIONS`)."""
    req = request(model, 1, gpu, global_batch, "megatron")
    prec = get_precision(req.precision)
    params = UniformEvaluator(req.model, req.cluster, global_batch, req.seq_len).graph(1).parameter_count()
    held = prec.param_bytes + (0 if offload else prec.optimizer_state_bytes)
    bound = params * held / req.budget_bytes
    n = 2 ** max(0, math.ceil(math.log2(bound)) - 1) if bound > 1 else 1  # below the bound when above 1
    while n <= gpus:
        yield n
        n *= 2


def fewest(model: str, gpus: int, gpu: str, global_batch: int) -> dict[str, str]:
    """The fewest GPUs (scanned) on which the grid and each target's plan fit; '>N' when none does."""
    out: dict[str, str] = {}
    checks = {"grid": grid_fits, "megatron": plan_fits, "any": plan_fits}
    for name, fits in checks.items():
        scanned = list(counts(model, gpus, gpu, global_batch, offload=name != "grid"))
        out[name] = f">{gpus}"
        for k, n in enumerate(scanned):
            if fits(request(model, n, gpu, global_batch, "megatron" if name == "grid" else name)):
                out[name] = str(n) + (" (below the bound!)" if k == 0 and n > 1 else "")
                break
    return out


def step(doc: dict[str, Any]) -> tuple[str, float | None]:
    if doc["memory"] is None:
        return "nothing fits", None
    return doc["strategy"]["summary"], float(doc["time"]["step_seconds"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the first case only (a smoke run)")
    args = ap.parse_args(argv)
    print(header("parplan's plans against the best uniform Megatron-LM configuration (predicted)"))
    print("| model | GPUs | GPU | batch | grid (pruned) | best grid config | grid s | megatron plan | megatron s "
          "| any plan | any s | speedup megatron | speedup any | fewest GPUs grid / megatron / any | bench s |")
    print("|---|---:|---|---:|---:|---|---:|---|---:|---|---:|---:|---:|---|---:|")
    sp_meg: list[float] = []
    sp_any: list[float] = []
    for model, gpus, gpu, gb in QUICK if args.quick else CASES:
        t0 = time.perf_counter()
        gr = grid(request(model, gpus, gpu, gb, "megatron"))
        meg, meg_s = step(solve(request(model, gpus, gpu, gb, "megatron")))
        anyp, any_s = step(solve(request(model, gpus, gpu, gb, "any")))
        few = fewest(model, gpus, gpu, gb)
        ratio = [f"{gr.step_seconds / s:.3f}x" if gr.step_seconds and s else "-" for s in (meg_s, any_s)]
        if gr.step_seconds and meg_s and any_s:
            sp_meg.append(gr.step_seconds / meg_s)
            sp_any.append(gr.step_seconds / any_s)
        g_s, m_s, a_s = (f"{s:.3f}" if s else "-" for s in (gr.step_seconds, meg_s, any_s))
        print(f"| {model} | {gpus} | {gpu} | {gb} | {gr.size} ({gr.pruned}) | {gr.best or 'nothing fits'} | {g_s} "
              f"| {meg} | {m_s} | {anyp} | {a_s} | {ratio[0]} | {ratio[1]} "
              f"| {few['grid']} / {few['megatron']} / {few['any']} | {time.perf_counter() - t0:.0f} |", flush=True)
    if sp_any:
        gm = [math.exp(sum(map(math.log, xs)) / len(xs)) for xs in (sp_meg, sp_any)]
        print(f"\nSpeedup over the best grid configuration (grid s / plan s), {len(sp_any)} cases: "
              f"megatron geometric mean {gm[0]:.3f}x, least {min(sp_meg):.3f}x; "
              f"any geometric mean {gm[1]:.3f}x, least {min(sp_any):.3f}x "
              f"(goals of issue 51: any >= 1.15x, megatron >= 1.05x, no case below 1.0x).")
    return 0


if __name__ == "__main__":
    sys.exit(main())

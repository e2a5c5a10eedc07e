"""Solve plan requests (:class:`~parplan.solver.request.PlanRequest`, read and validated by
:mod:`parplan.solver.request`). ``solve`` runs the search (seconds to minutes) and returns the plan
document whose keys docs/design.md fixes (the same as ``parplan plan --json``).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Container
from dataclasses import dataclass
from typing import Any

from parplan.solver import SOLVER_VERSION
from parplan.solver.baselines import (
    BASELINES,
    Candidate,
    UniformEvaluator,
    baseline,
    fastest_fitting,
    least_memory_member,
    least_memory_within,
)
from parplan.solver.calibration import Calibration
from parplan.solver.cluster import Cluster
from parplan.solver.cost.pipeline import blocks_of
from parplan.solver.cost.units import GraphCosts
from parplan.solver.errors import SolverError
from parplan.solver.evaluate import Evaluation
from parplan.solver.progress import ProgressFn
from parplan.solver.request import PlanRequest
from parplan.solver.targets import SPECS, Target, runnable
from parplan.solver.time_accuracy import time_accuracy


def _baselines(req: PlanRequest, ev: UniformEvaluator, num_blocks: int,
               runnable: Container[Candidate] | None = None, own: str | None = None) -> dict[str, Evaluation | None]:
    """The baselines; under a uniform target its own one (``own``) among what it runs only."""
    return {name: baseline(name, ev, req.budget_bytes, num_blocks, runnable if name == own else None)
            for name in BASELINES}


def _infeasible(req: PlanRequest, least_bytes: float | None, least: dict[str, Any] | None) -> dict[str, Any]:
    msg = (f"no strategy fits {req.budget_bytes / 2**30:.1f} GiB per device; the least memory any plan needs is "
           f"{least_bytes / 2**30:.1f} GiB per device" if least_bytes is not None
           else "no strategy applies to this model and cluster")
    return {"memory": None, "time": None, "strategy": None, "least_memory": least,
            "least_memory_bytes": round(least_bytes) if least_bytes is not None else None, "message": msg,
            "solver": {"status": "infeasible"}}


def _ilp(req: PlanRequest, report: ProgressFn, reference_seconds: float | None) -> dict[str, Any]:
    from parplan.solver.ilp.search import search

    mb = None
    if req.micro_batch:
        mb = min(req.global_batch, req.micro_batch * req.cluster.num_devices)
    doc = search(lambda b: req.model.build(b, req.seq_len), req.cluster, global_batch=req.global_batch,
                 micro_batch=mb if mb and req.global_batch % mb == 0 else None, objective=req.objective,
                 budget_bytes=req.budget_bytes, max_slowdown=req.max_slowdown, alpha_gib_per_s=req.alpha,
                 calibration=req.calibration, timeout_seconds=req.time_limit_seconds,
                 progress=lambda stage, f: report(stage, 0.3 + 0.65 * f), reference_seconds=reference_seconds,
                 fixed_mesh=req.mesh, runtime=SPECS[req.target].runtime, precision=req.precision)
    if doc["solver"]["status"] == "infeasible":
        out = _infeasible(req, doc["memory"]["peak_bytes"], None)
        out["solver"] = doc["solver"]
        return out
    return doc


def _least_known(req: PlanRequest, doc: dict[str, Any], docs: list[dict[str, Any]],
                 bases: dict[str, Any]) -> dict[str, Any]:
    """An infeasible answer whose least memory is the least of every search's (both under ``auto``)
    and every baseline's, fitting or not: one may need less than another's own least (its granularity)."""
    least = min([doc["least_memory_bytes"], *(d["least_memory_bytes"] for d in docs
                                              if d.get("least_memory_bytes") is not None),
                 *(b.memory.peak_bytes for b in bases.values() if b is not None)])
    if least >= doc["least_memory_bytes"]:
        return doc
    out = _infeasible(req, least, None)
    out["solver"] = doc.get("solver", {})
    return out


def solve(req: PlanRequest, progress: ProgressFn | None = None) -> dict[str, Any]:
    """Search for the plan and return its document (raises SolverError on bad combinations).

    The baselines (Megatron-LM, ZeRO-3, DP) are always computed in the same cost model. ``search``
    picks the method: ``ilp`` (intra-operator ILP, the memory-redundancy paper), ``dp``
    (Galvatron-BMW dynamic programming), ``auto`` (see :func:`choose_method`). The answer is the
    best, for the objective, of every plan known: the search's, its Pareto frontier's, the other
    search's under ``auto``, and the baselines' (see :func:`choose`), so no baseline and no point
    of the frontier beats it on both memory and time."""
    t0 = time.perf_counter()
    report: ProgressFn = progress or (lambda stage, fraction: None)
    report("building", 0.0)
    spec = SPECS[req.target]
    ev = UniformEvaluator(req.model, req.cluster, req.global_batch, req.seq_len, req.calibration,
                          precision=req.precision, runtime=spec.runtime)
    num_blocks = len(blocks_of(ev.graph(req.micro_batch or 1)))
    report("baselines", 0.05)
    runs = runnable(req.target, req.cluster, req.global_batch, ev.graph(req.micro_batch or 1))
    bases = _baselines(req, ev, num_blocks, runs, spec.baseline)
    fitting = [b for b in bases.values() if b is not None and b.fits]
    reference = min((b.time.step_seconds for b in fitting), default=None)
    method, why = choose_method(req)
    report("search", 0.3)
    docs: list[dict[str, Any]] = []
    if method == "uniform":
        assert isinstance(runs, set)
        docs.append(_uniform(req, ev, runs))
    elif method == "ilp":
        docs.append(_ilp(req, report, reference))
    elif method == "dp" and req.target is Target.GALVATRON:
        from parplan.solver.dp.space import SpaceOptions

        # Galvatron runs per block DDP or ZeRO-2 (one of them for the whole model, its default_dp_type)
        # or sharded data parallelism; no ZeRO-1, no mix of DDP and ZeRO-2: one search for each default;
        # no context parallelism
        for i, default in enumerate((0, 2)):
            options = SpaceOptions(zero_stages=(default, 3), max_tp=req.cluster.gpus_per_node, max_cp=1)
            docs.append(_dp(req, _part(report, 0.3 + 0.35 * i, 0.35), bases.get("megatron"), ev.costs, options))
    elif method == "dp":
        docs.append(_dp(req, report, bases.get("megatron"), ev.costs))
    else:
        docs.append(_dp(req, lambda st, f: report(st, 0.3 + 0.2 * f), bases.get("megatron"), ev.costs))
        try:  # the ILP gets what is left of the time limit after the (fast) DP
            left = max(1.0, req.time_limit_seconds - (time.perf_counter() - t0))
            docs.append(_ilp(dataclasses.replace(req, time_limit_seconds=left),
                             lambda st, f: report(st, 0.5 + 0.45 * f), reference))
        except SolverError as e:
            why += f"; the ILP stopped ({e}), so the DP's plan"
    searched = docs[-1] if method == "ilp" else docs[0]
    candidates = [Known(d["solver"]["method"], d["time"]["step_seconds"], d["memory"]["peak_bytes"],
                        functools.partial(_itself, d)) for d in docs if d.get("memory") and d.get("time")]
    candidates += [k for d in docs for k in d.pop("_frontier", [])]
    candidates += [Known(f"baseline {n}", b.time.step_seconds, b.memory.peak_bytes,
                         functools.partial(_baseline_document, n, b)) for n, b in bases.items()
                   if b is not None and (runs is None or _candidate(b) in runs)]
    # the searches' fastest plans, whose documents are not kept (a min-memory search returns its
    # least-memory plan), are known plans too: the time limit counts from them
    searched_best = [d["solver"]["best_time_seconds"] for d in docs
                     if d.get("memory") and (d.get("solver") or {}).get("best_time_seconds")]
    if req.objective == "min-memory":
        candidates += _least_memory_uniform(req, ev, num_blocks, runs, candidates, searched_best)
    best = choose(req, candidates, searched_best)
    frontier = next((d["pareto"] for d in docs if d.get("pareto")), None)
    doc = searched if best is None else best.document()
    if best is None and doc.get("least_memory_bytes") is not None:
        doc = _least_known(req, doc, docs, bases)
    if frontier is not None:
        doc["pareto"] = frontier  # the frontier the answer was chosen against, whichever plan won
    if best is not None and doc is not searched:
        doc.setdefault("solver", {})["chosen_over"] = searched.get("solver", {})
        why += f"; chose {best.label}" + ("" if best.label in ("ilp", "dp") else
                                          " (no searched plan beats it for the objective)")
    doc["baselines"] = {n: b.to_dict() | {"fits": b.fits} if b else None for n, b in bases.items()}
    if doc.get("memory") and doc.get("time"):
        doc["relative"] = {n: _relative_doc(doc, b) for n, b in bases.items()}
    doc["target"] = _target_doc(req, doc, bases.get(spec.baseline))
    doc["objective"] = {"kind": req.objective, "alpha": req.alpha, "max_slowdown": req.max_slowdown,
                        "memory_budget_bytes": req.budget_bytes,
                        "fastest_known_seconds": _fastest(req, candidates, searched_best)}
    solver = doc.setdefault("solver", {})
    solver.update({"method": solver.get("method", method), "seconds": time.perf_counter() - t0,
                   "version": SOLVER_VERSION, "why": why})
    solver.setdefault("gap", None)
    work = dict(searched.get("solver", {}).get("work") or {})
    for d in docs:  # every search that ran keeps its counts, whichever plan won (the ILP's under "ilp")
        if d is not searched:
            work.update(d.get("solver", {}).get("work") or {})
    work["baseline_evaluations"] = ev.evaluations  # step times priced
    work["baseline_memory_evaluations"] = ev.memory_evaluations
    solver["work"] = work
    doc.setdefault("model", {"name": req.model.name, "parameters": ev.graph(1).parameter_count(),
                             "seq_len": req.seq_len})
    arch = req.model.architecture()
    if arch is not None:  # what exports need to write the model (parplan.exports)
        doc["model"]["architecture"] = arch
    doc.setdefault("cluster", {"gpus": req.cluster.num_devices, "gpus_per_node": req.cluster.gpus_per_node,
                               "gpu": req.cluster.gpu.name, "device_memory_bytes": req.cluster.device_memory_bytes})
    report("done", 1.0)
    return doc


#: Relative difference of two step times that counts as equal (floating-point rounding), in choosing.
TIME_TIE = 1e-9


@dataclass(frozen=True)
class Known:
    """A plan known to the planner: its step time (s), peak memory per device (bytes), and how to
    write its document (built only for the one chosen)."""

    label: str
    step_seconds: float
    peak_bytes: float
    document: Callable[[], dict[str, Any]]


def _fastest(req: PlanRequest, known: list[Known], searched_best: list[float]) -> float | None:
    """Seconds per step of the fastest plan known that fits (None: none fits); under ``min-memory``
    the searches' fastest (``searched_best``) count too, whose documents are not kept."""
    times = [k.step_seconds for k in known if k.peak_bytes <= req.budget_bytes]
    if not times:
        return None
    return min(times + searched_best) if req.objective == "min-memory" else min(times)


def choose(req: PlanRequest, known: list[Known], searched_best: list[float] | None = None) -> Known | None:
    """The best known plan that fits the budget, for the objective (None: none fits).

    ``max-throughput``: the fastest (then the least memory). ``min-memory``: the least memory (then
    the fastest) among plans within ``(1 + max_slowdown)`` of the fastest known plan, baselines
    and the searches' fastest (``searched_best``, step times of plans not among ``known``)
    included; with ``alpha``, the least ``memory + alpha·time``. Either way no known plan is at
    least as good on both memory and time and better on one."""
    fits = [k for k in known if k.peak_bytes <= req.budget_bytes]
    if not fits:
        return None
    if req.objective == "max-throughput":
        # times equal but for rounding (two pricings of the same plan) are a tie, which memory decides
        fastest = min(k.step_seconds for k in fits) * (1 + TIME_TIE)
        return min((k for k in fits if k.step_seconds <= fastest), key=lambda k: (k.peak_bytes, k.step_seconds))
    if req.alpha is not None:
        alpha = req.alpha * 2**30
        return min(fits, key=lambda k: (k.peak_bytes + alpha * k.step_seconds, k.step_seconds))
    limit = _limit(req, known, searched_best or [])
    return min((k for k in fits if limit is not None and k.step_seconds <= limit),
               key=lambda k: (k.peak_bytes, k.step_seconds), default=None)


def _limit(req: PlanRequest, known: list[Known], searched_best: list[float]) -> float | None:
    """``min-memory``'s time limit: ``(1 + max_slowdown)`` times :func:`_fastest` (None: none fits)."""
    fastest = _fastest(req, known, searched_best)
    return None if fastest is None else fastest * (1 + req.max_slowdown) * (1 + TIME_TIE)


def _least_memory_uniform(req: PlanRequest, ev: UniformEvaluator, num_blocks: int,
                          runs: Container[Candidate] | None, known: list[Known],
                          searched_best: list[float]) -> list[Known]:
    """``min-memory``: the baseline families' least-memory member within ``(1 + max_slowdown)`` of
    the fastest known plan (or the least ``memory + alpha·time``), as one more known plan. Each
    baseline is its family's fastest; a slower member of the same family (ZeRO-3 at a smaller
    micro-batch, say) can hold far less within the limit, and the answer must not be beaten by it.
    ``searched_best``: the searches' fastest step times (s), whose plans are not among ``known``
    (the ILP keeps only its min-memory answer); the limit counts from them too, as the searches' did."""
    limit = _limit(req, known, searched_best)
    if limit is None:
        return []
    alpha = req.alpha * 2**30 if req.alpha is not None else None
    e = least_memory_member(ev, req.budget_bytes, num_blocks, limit, alpha, runs)
    if e is None:
        return []
    return [Known("uniform", e.time.step_seconds, e.memory.peak_bytes, functools.partial(_uniform_document, e))]


def _uniform_document(e: Evaluation) -> dict[str, Any]:
    doc = _baseline_document("uniform", e)
    doc["solver"] = {"method": "uniform", "status": "optimal", "gap": None,
                     "note": "the least memory of the baseline families' members within the time limit"}
    return doc


def _itself(doc: dict[str, Any]) -> dict[str, Any]:
    return doc


def _baseline_document(name: str, e: Evaluation) -> dict[str, Any]:
    """A baseline's evaluation as the plan document."""
    doc = e.to_dict()
    doc["strategy"] = {"kind": "uniform", **doc["strategy"]}
    doc["solver"] = {"method": f"baseline:{name}", "status": "optimal", "gap": None}
    return doc


def choose_method(req: PlanRequest) -> tuple[str, str]:
    """Which search to run, and why (``auto`` picks by problem shape)."""
    spec = SPECS[req.target]
    if spec.uniform:
        return "uniform", (f"target {req.target.value}: every uniform strategy it runs, priced with the "
                           f"{spec.runtime.value} runtime's buffers")
    if spec.searches == ("dp",):
        return "dp", f"target {req.target.value}: per-layer hybrid parallelism by dynamic programming"
    if spec.searches == ("ilp",):
        return "ilp", f"target {req.target.value}: per-operator plans by the ILP, which the agent runs"
    if req.search == "ilp":
        return "ilp", "requested: intra-operator ILP"
    if req.search == "dp":
        return "dp", "requested: per-layer hybrid parallelism by dynamic programming"
    if req.mesh is not None:
        return "ilp", "auto: a device mesh was given, which only the ILP uses"
    blocks = len(blocks_of(req.model.build(1, req.seq_len)))
    if blocks == 0:
        return "ilp", "auto: the graph has no repeated blocks for the layer-wise DP; intra-operator ILP"
    if req.cluster.num_devices <= req.cluster.gpus_per_node:
        return "both", ("auto: one node — both the intra-operator ILP and the per-layer DP run, the better plan "
                        "for the objective wins")
    return "dp", ("auto: several nodes — pipeline stages across nodes are needed, which the per-layer DP "
                  "searches (the ILP plans one mesh without pipelining)")


def _part(report: ProgressFn, start: float, width: float) -> ProgressFn:
    """Progress of one part of the work, from ``start`` over ``width`` of the whole."""
    return lambda stage, fraction: report(stage, start + width * fraction)


def _candidate(e: Evaluation) -> Candidate:
    s = e.strategy
    return Candidate(s.tp, s.pp, s.dp, s.zero, s.sequence_parallel, s.recompute, s.micro_batch, s.schedule,
                     s.virtual_stages, s.expert_parallel)


def _uniform(req: PlanRequest, ev: UniformEvaluator, runnable: set[Candidate]) -> dict[str, Any]:
    """The best of every uniform strategy a target runs, each priced by the whole-plan evaluator:
    the fastest that fits (max-throughput); the least memory within ``(1 + max_slowdown)`` of it,
    or the least ``memory + alpha·time`` (min-memory)."""
    cands = sorted(runnable, key=lambda c: (c.tp, c.pp, c.dp, c.zero, c.sp, c.recompute.value, c.micro_batch,
                                            c.schedule.value, c.virtual, c.ep))
    fastest = fastest_fitting(ev, cands, req.budget_bytes)
    if fastest is None or not fastest.fits:
        out = _infeasible(req, fastest.memory.peak_bytes if fastest else None, None)
        out["solver"] = {"method": "uniform", "status": "infeasible", "gap": None, "candidates": len(cands)}
        return out
    best = fastest
    if req.objective == "min-memory":
        alpha = req.alpha * 2**30 if req.alpha is not None else None
        best = least_memory_within(ev, cands, req.budget_bytes, fastest.time.step_seconds * (1 + req.max_slowdown)
                                   * (1 + 1e-9), alpha) or fastest
    doc = _baseline_document("uniform", best)
    doc["solver"] = {"method": "uniform", "status": "optimal", "gap": None, "candidates": len(cands),
                     "best_time_seconds": fastest.time.step_seconds,
                     "note": f"exhaustive over the {len(cands)} uniform strategies target {req.target.value} runs"}
    return doc


def _target_doc(req: PlanRequest, doc: dict[str, Any], base: Evaluation | None) -> dict[str, Any]:
    """The target, its runtime, and how the answer compares with the target's own baseline
    (saved bytes per device and seconds per step: positive is better than the baseline)."""
    spec = SPECS[req.target]
    out: dict[str, Any] = {"name": req.target.value, "runtime": spec.runtime.value, "baseline": spec.baseline,
                           "versus_baseline": None, "unpriced": list(spec.unpriced)}
    if base is not None and doc.get("memory") and doc.get("time"):
        out["versus_baseline"] = {
            "baseline_fits": base.fits,
            "memory_saved_bytes": round(base.memory.peak_bytes - doc["memory"]["peak_bytes"]),
            "seconds_saved": base.time.step_seconds - doc["time"]["step_seconds"],
            "memory_ratio": doc["memory"]["peak_bytes"] / base.memory.peak_bytes,
            "time_ratio": doc["time"]["step_seconds"] / base.time.step_seconds}
    return out


def _dp(req: PlanRequest, report: ProgressFn, megatron: Evaluation | None,
        graph_costs: Callable[[int], GraphCosts], options: Any = None) -> dict[str, Any]:
    from parplan.solver.cost.plan_memory import layer_plan
    from parplan.solver.dp.search import search

    reference = None
    if megatron is not None and megatron.fits:
        reference = layer_plan(req.model.build(megatron.strategy.micro_batch, req.seq_len), megatron.strategy)
    res = search(lambda b: req.model.build(b, req.seq_len), req.cluster, global_batch=req.global_batch,
                 objective=req.objective, budget_bytes=req.budget_bytes, max_slowdown=req.max_slowdown,
                 alpha_gib_per_s=req.alpha, calibration=req.calibration, reference=reference,
                 timeout_seconds=req.time_limit_seconds, progress=report, pareto=req.pareto, graph_costs=graph_costs,
                 options=options, precision=req.precision)
    if res["status"] == "infeasible":
        out = _infeasible(req, res["least"], None)
        out["solver"] = {"method": "dp", "status": "infeasible", "gap": None, "candidates": res["candidates"],
                         "work": res["work"]}
        return out
    doc = layer_plan_document(res["plan"], res["evaluator"], req)
    doc["solver"] = {"method": "dp", "status": "optimal", "gap": None, "candidates": res["candidates"],
                     "pareto": "complete" if req.pareto else "partial",
                     "best_time_seconds": res["best_seconds"], "search_seconds": res["seconds"], "work": res["work"],
                     "note": "exact per stage for the memory granularity (1/512 of the budget); pipeline degree, "
                             "micro-batch count and partition searched over candidates"}
    doc["pareto"] = [{"step_seconds": secs, "peak_bytes": round(peak), "summary": plan_summary(plan)}
                     for secs, peak, plan in res["frontier"]]
    ev = res["evaluator"]
    doc["_frontier"] = [Known("dp frontier", secs, peak, functools.partial(_frontier_document, plan, ev, req))
                        for secs, peak, plan in res["frontier"]]
    return doc


def _frontier_document(plan: Any, ev: Any, req: PlanRequest) -> dict[str, Any]:
    doc = layer_plan_document(plan, ev, req)
    doc["solver"] = {"method": "dp", "status": "optimal", "gap": None, "note": "a point of the DP's Pareto frontier"}
    return doc


def plan_summary(plan: Any) -> str:
    kinds = sorted({s.describe() for s in plan.layers.values()})
    return (f"pp{plan.pp} x {plan.num_microbatches} micro-batches, partition {list(plan.partition or [])}: "
            + "; ".join(kinds))


def layer_plan_document(plan: Any, ev: Any, req: PlanRequest) -> dict[str, Any]:
    """A per-layer plan as the plan document (docs/design.md's keys)."""
    return per_layer_document(plan, ev, req.cluster, req.calibration)


def per_layer_document(plan: Any, ev: Any, cluster: Cluster, calibration: Calibration) -> dict[str, Any]:
    """A per-layer plan priced by ``ev`` (a PlanEvaluator) on ``cluster``: the plan document's
    strategy, memory and time."""
    mem = ev.memory(plan)
    t = ev.time(plan)
    peak = mem.peak_stage
    runs: list[dict[str, Any]] = []
    for unit, s in plan.layers.items():
        text = s.describe()
        if runs and runs[-1]["strategy"] == text and runs[-1]["stage"] == _stage_of(plan, unit):
            runs[-1]["last"] = unit
            runs[-1]["count"] += 1
        else:
            runs.append({"first": unit, "last": unit, "count": 1, "strategy": text, "stage": _stage_of(plan, unit),
                         "tp": s.tp, "dp": s.dp, "zero": s.zero, "sequence_parallel": s.sp,
                         "recompute": s.recompute.value, "tp_inner": s.tp_inner, "expert_parallel": s.ep,
                         "cp": s.cp, "cp_comm": s.cp_comm})
    return {
        "strategy": {"kind": "per-layer", "summary": plan_summary(plan), "pp": plan.pp,
                     "cp": max(s.cp for s in plan.layers.values()),
                     "num_microbatches": plan.num_microbatches, "global_batch": plan.global_batch,
                     "partition": list(plan.partition or []), "schedule": plan.schedule.value,
                     "layers": runs, "precision": plan.precision, "flash_attention": plan.flash_attention},
        "memory": {"peak_bytes": round(peak.peak_bytes), "peak_stage": peak.stage,
                   "fits": peak.peak_bytes <= cluster.device_memory_bytes,
                   "device_memory_bytes": cluster.device_memory_bytes,
                   "breakdown": peak.memory.bytes.as_dict(), "redundant": peak.memory.redundant.as_dict(),
                   "stages": [{"stage": st.stage, "peak_bytes": round(st.peak_bytes),
                               "breakdown": st.memory.bytes.as_dict(),
                               "in_flight_microbatches": st.in_flight_microbatches} for st in mem.stages]},
        "time": {"step_seconds": t.step_seconds, "tokens_per_second": t.tokens_per_second,
                 "samples_per_second": plan.global_batch / t.step_seconds if t.step_seconds else 0.0,
                 "bubble_fraction": t.bubble_fraction, "calibration": calibration.source,
                 "accuracy": time_accuracy(calibration, cluster.gpu.name, plan.runtime.value)},
    }


def _stage_of(plan: Any, unit: str) -> int:
    index = list(plan.layers).index(unit)
    total = 0
    for stage, count in enumerate(plan.partition or [len(plan.layers)]):
        total += count
        if index < total:
            return stage
    return len(plan.partition or [1]) - 1


def _relative_doc(doc: dict[str, Any], base: Evaluation | None) -> dict[str, float] | None:
    if base is None:
        return None
    return {"memory": doc["memory"]["peak_bytes"] / base.memory.peak_bytes,
            "time": doc["time"]["step_seconds"] / base.time.step_seconds,
            "throughput": doc["time"]["tokens_per_second"] / base.time.tokens_per_second}

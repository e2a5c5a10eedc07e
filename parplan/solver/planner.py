"""Solve plan requests (:class:`~parplan.solver.request.PlanRequest`, read and validated by
:mod:`parplan.solver.request`). ``solve`` runs the search (seconds to minutes) and returns the plan
document whose keys docs/design.md fixes (the same as ``parplan plan --json``).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Container, Mapping
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
from parplan.solver.cost.pipeline import blocks_of
from parplan.solver.dp.space import SpaceOptions
from parplan.solver.errors import SolverError
from parplan.solver.evaluate import GraphProvider
from parplan.solver.objective import Objective as ObjectiveRule
from parplan.solver.progress import ProgressFn
from parplan.solver.request import PlanRequest
from parplan.solver.result import (
    Evaluation,
    ModelReport,
    ObjectiveReport,
    ParetoPoint,
    PlanResult,
    SolverReport,
    TargetReport,
    UniformStrategy,
    per_layer_result,
    plan_document,
    plan_summary,
)
from parplan.solver.targets import SPECS, Target, offload_variants, runnable


def _baselines(req: PlanRequest, ev: UniformEvaluator, num_blocks: int,
               runnable: Container[Candidate] | None = None, own: str | None = None) -> dict[str, Evaluation | None]:
    """The baselines; under a uniform target its own one (``own``) among what it runs only."""
    return {name: baseline(name, ev, req.budget_bytes, num_blocks, runnable if name == own else None)
            for name in BASELINES}


def _infeasible(req: PlanRequest, least_bytes: float | None, solver: SolverReport) -> PlanResult:
    msg = (f"no strategy fits {req.budget_bytes / 2**30:.1f} GiB per device; the least memory any plan needs is "
           f"{least_bytes / 2**30:.1f} GiB per device" if least_bytes is not None
           else "no strategy applies to this model and cluster")
    return PlanResult(None, None, None, solver, least_memory_bytes=least_bytes, message=msg)


def _ilp(req: PlanRequest, graphs: GraphProvider, report: ProgressFn, reference_seconds: float | None) -> PlanResult:
    from parplan.solver.ilp.search import search

    step = None  # samples per micro-step: micro_batch x the largest data-parallel degree the rule allows
    if req.micro_batch:
        step = req.micro_batch * max(req.data_parallel_degrees())
    res = search(graphs.graph, req.cluster, global_batch=req.global_batch,
                 micro_batch=step, objective=req.objective,
                 budget_bytes=req.budget_bytes, max_slowdown=req.max_slowdown, alpha_gib_per_s=req.alpha,
                 calibration=req.calibration, timeout_seconds=req.time_limit_seconds,
                 progress=lambda stage, f: report(stage, 0.3 + 0.65 * f), reference_seconds=reference_seconds,
                 fixed_mesh=req.mesh, runtime=SPECS[req.target].runtime, precision=req.precision)
    if res.solver is not None and res.solver.status == "infeasible":
        assert res.memory is not None
        return _infeasible(req, round(res.memory.peak_bytes), res.solver)
    return res


def _least_known(req: PlanRequest, searched: PlanResult, results: list[PlanResult],
                 bases: Mapping[str, Evaluation | None]) -> PlanResult:
    """An infeasible answer whose least memory is the least of every search's (both under ``auto``)
    and every baseline's, fitting or not: one may need less than another's own least (its granularity)."""
    assert searched.least_memory_bytes is not None and searched.solver is not None
    own = round(searched.least_memory_bytes)
    least = min([own, *(round(r.least_memory_bytes) for r in results if r.least_memory_bytes is not None),
                 *(b.memory.peak_bytes for b in bases.values() if b is not None)])
    if least >= own:
        return searched
    return _infeasible(req, least, searched.solver)


@dataclass(frozen=True)
class Known:
    """A plan known to the planner: its step time (s), peak memory per device (bytes), and its
    result (built only for the one chosen)."""

    label: str
    step_seconds: float
    peak_bytes: float
    result: Callable[[], PlanResult]


def _searched(req: PlanRequest, method: str, ev: UniformEvaluator, graphs: GraphProvider,
              runs: Container[Candidate] | None, bases: Mapping[str, Evaluation | None], report: ProgressFn,
              t0: float) -> tuple[list[Searched], str]:
    """Run the chosen search (both under ``auto`` on one node): each search's result and its
    Pareto frontier (the DP's), and a note when the ILP stopped."""
    reference = min((b.time.step_seconds for b in bases.values() if b is not None and b.fits), default=None)
    out: list[Searched] = []
    megatron = bases.get("megatron")
    if method == "uniform":
        assert isinstance(runs, set)
        out.append(Searched(_uniform(req, ev, runs)))
    elif method == "ilp":
        out.append(Searched(_ilp(req, graphs, report, reference)))
    elif method == "dp" and req.target is Target.GALVATRON:
        from parplan.solver.dp.space import SpaceOptions

        # Galvatron runs per block DDP or ZeRO-2 (one of them for the whole model, its default_dp_type)
        # or sharded data parallelism; no ZeRO-1, no mix of DDP and ZeRO-2: one search for each default;
        # no context parallelism
        for i, default in enumerate((0, 2)):
            options = SpaceOptions(zero_stages=(default, 3), max_tp=req.cluster.gpus_per_node, max_cp=1)
            out.append(_dp(req, _part(report, 0.3 + 0.35 * i, 0.35), megatron, graphs, options))
    elif method == "dp":
        out.append(_dp(req, report, megatron, graphs))
    else:
        out.append(_dp(req, _part(report, 0.3, 0.2), megatron, graphs))
        try:  # the ILP gets what is left of the time limit after the (fast) DP
            left = max(1.0, req.time_limit_seconds - (time.perf_counter() - t0))
            out.append(Searched(_ilp(dataclasses.replace(req, time_limit_seconds=left), graphs,
                                     _part(report, 0.5, 0.45), reference)))
        except SolverError as e:
            return out + _megatron_family(req, ev), f"; the ILP stopped ({e}), so the DP's plan"
    if method in ("dp", "both"):
        out += _megatron_family(req, ev)
    return out, ""


def _megatron_family(req: PlanRequest, ev: UniformEvaluator) -> list[Searched]:
    """Under target ``any`` with ``search`` auto and no mesh given: the best of every uniform strategy
    Megatron-LM runs (target ``megatron``'s whole search), so that the answer is never beaten by a
    plan the megatron target would return (the per-layer searches have no interleaved schedule and
    no overlap options). An explicitly requested search runs alone, beside the baselines."""
    if req.target is not Target.ANY or req.search != "auto" or req.mesh is not None:
        return []
    runs = runnable(Target.MEGATRON, req.cluster, req.global_batch, ev.graph(req.micro_batch or 1), req.micro_batch)
    assert isinstance(runs, set)
    return [Searched(_uniform(req, ev, runs, Target.MEGATRON))]


@dataclass(frozen=True)
class Searched:
    """A search's result, and the other plans it found that the answer is chosen among (the DP's
    Pareto frontier, each written only if chosen)."""

    result: PlanResult
    frontier: tuple[Known, ...] = ()
    pareto: tuple[ParetoPoint, ...] | None = None


def _known(searched: list[Searched], bases: Mapping[str, Evaluation | None],
           runs: Container[Candidate] | None) -> list[Known]:
    """Every plan known: the searches' answers, their frontiers, the baselines the target runs."""
    known = [Known(r.solver.method, r.time.step_seconds, r.memory.peak_bytes, functools.partial(_itself, r))
             for r in (s.result for s in searched) if r.memory is not None and r.time is not None
             and r.solver is not None]
    known += [k for s in searched for k in s.frontier]
    known += [Known(f"baseline {n}", b.time.step_seconds, b.memory.peak_bytes,
                    functools.partial(_baseline_result, n, b))
              for n, b in bases.items() if b is not None and (runs is None or _candidate(b) in runs)]
    return known


def solve(req: PlanRequest, progress: ProgressFn | None = None) -> dict[str, Any]:
    """Search for the plan and return its document (:func:`parplan.solver.result.plan_document` of
    :func:`solve_plan`; the keys DESIGN.md fixes, as ``parplan plan --json``)."""
    return plan_document(solve_plan(req, progress))


def solve_plan(req: PlanRequest, progress: ProgressFn | None = None) -> PlanResult:
    """Search for the plan (raises SolverError on bad combinations).

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
    graphs = GraphProvider(req.model, req.seq_len)  # each micro-batch's graph built once in this solve
    ev = UniformEvaluator(req.model, req.cluster, req.global_batch, req.seq_len, req.calibration,
                          precision=req.precision, runtime=spec.runtime, graphs=graphs, micro_batch=req.micro_batch)
    num_blocks = len(blocks_of(ev.graph(req.micro_batch or 1)))
    report("baselines", 0.05)
    runs = runnable(req.target, req.cluster, req.global_batch, ev.graph(req.micro_batch or 1), req.micro_batch)
    bases = _baselines(req, ev, num_blocks, runs, spec.baseline)
    method, why = choose_method(req, graphs)
    report("search", 0.3)
    found, stopped = _searched(req, method, ev, graphs, runs, bases, report, t0)
    why += stopped
    results = [s.result for s in found]
    searched = results[-1] if method == "ilp" else results[0]
    known = _known(found, bases, runs)
    # the searches' fastest plans, whose results are not kept (a min-memory search returns its
    # least-memory plan), are known plans too: the time limit counts from them
    searched_best = [r.solver.best_time_seconds for r in results
                     if r.memory is not None and r.solver is not None and r.solver.best_time_seconds]
    if req.objective == "min-memory":
        known += _least_memory_uniform(req, ev, num_blocks, runs, known, searched_best)
    best = choose(req, known, searched_best)
    chosen = searched if best is None else best.result()
    if best is None and chosen.least_memory_bytes is not None:
        chosen = _least_known(req, chosen, results, bases)
    solver = chosen.solver or SolverReport(method, "infeasible")
    if best is not None and chosen is not searched:
        solver = dataclasses.replace(solver, chosen_over=searched.solver)
        why += f"; chose {best.label}" + ("" if best.label in ("ilp", "dp") else
                                          " (no searched plan beats it for the objective)")
    work: dict[str, Any] = dict((searched.solver.work if searched.solver else None) or {})
    for r in results:  # every search that ran keeps its counts, whichever plan won (the ILP's under "ilp")
        if r is not searched and r.solver is not None:
            work.update(r.solver.work or {})
    work["baseline_evaluations"] = ev.evaluations  # step times priced
    work["baseline_memory_evaluations"] = ev.memory_evaluations
    solver = dataclasses.replace(solver, seconds=time.perf_counter() - t0, version=SOLVER_VERSION, why=why,
                                 work=work)
    model = chosen.model or ModelReport(req.model.name, ev.graph(1).parameter_count(), req.seq_len)
    report("done", 1.0)
    return dataclasses.replace(
        chosen, solver=solver, pareto=next((s.pareto for s in found if s.pareto), None), baselines=bases,
        target=TargetReport(req.target.value, spec.runtime.value, spec.baseline, tuple(spec.unpriced),
                            bases.get(spec.baseline)),
        objective=ObjectiveReport(req.objective, req.alpha, req.max_slowdown, req.budget_bytes,
                                  _fastest(req, known, searched_best)),
        model=dataclasses.replace(model, architecture=req.model.architecture()), cluster=req.cluster)


def objective_of(req: PlanRequest) -> ObjectiveRule:
    """The request's objective (:mod:`parplan.solver.objective`)."""
    return ObjectiveRule(req.objective, req.max_slowdown, req.alpha)


def _fastest(req: PlanRequest, known: list[Known], searched_best: list[float]) -> float | None:
    """Seconds per step of the fastest plan known that fits (None: none fits); under ``min-memory``
    the searches' fastest (``searched_best``) count too, whose results are not kept."""
    times = [k.step_seconds for k in known if k.peak_bytes <= req.budget_bytes]
    if not times:
        return None
    return min(times + searched_best) if req.objective == "min-memory" else min(times)


def choose(req: PlanRequest, known: list[Known], searched_best: list[float] | None = None) -> Known | None:
    """The best known plan that fits the budget for the objective (None: none fits), given the
    fastest known plan (:func:`_fastest`: under ``min-memory`` the searches' fastest,
    ``searched_best``, step times of plans not among ``known``, included); the rule is
    :meth:`parplan.solver.objective.Objective.best`. No known plan is at least as good on both
    memory and time and better on one."""
    fits = [k for k in known if k.peak_bytes <= req.budget_bytes]
    fastest = _fastest(req, known, searched_best or [])
    if fastest is None:
        return None
    return objective_of(req).best(fits, lambda k: k.step_seconds, lambda k: k.peak_bytes, fastest)


def _least_memory_uniform(req: PlanRequest, ev: UniformEvaluator, num_blocks: int,
                          runs: Container[Candidate] | None, known: list[Known],
                          searched_best: list[float]) -> list[Known]:
    """``min-memory``: the baseline families' best member for the objective given the fastest known
    plan, as one more known plan. Each baseline is its family's fastest; a slower member of the
    same family (ZeRO-3 at a smaller micro-batch, say) can hold far less within the limit, and the
    answer must not be beaten by it. ``searched_best``: the searches' fastest step times (s), whose
    plans are not among ``known`` (the ILP keeps only its min-memory answer); the limit counts from
    them too, as the searches' did."""
    fastest = _fastest(req, known, searched_best)
    if fastest is None:
        return []
    e = least_memory_member(ev, req.budget_bytes, num_blocks, objective_of(req), fastest, runs)
    if e is None:
        return []
    note = "the least memory of the baseline families' members within the time limit"
    return [Known("uniform", e.time.step_seconds, e.memory.peak_bytes,
                  functools.partial(_uniform_result, e, SolverReport("uniform", "optimal", note=note)))]


def _itself(result: PlanResult) -> PlanResult:
    return result


def _uniform_result(e: Evaluation, solver: SolverReport) -> PlanResult:
    """A uniform strategy's evaluation as a plan result."""
    return PlanResult(UniformStrategy(e.strategy), e.memory_report(), e.time_report(), solver,
                      model=e.model_report(), cluster=e.cluster)


def _baseline_result(name: str, e: Evaluation) -> PlanResult:
    return _uniform_result(e, SolverReport(f"baseline:{name}", "optimal"))


def choose_method(req: PlanRequest, graphs: GraphProvider | None = None) -> tuple[str, str]:
    """Which search to run, and why (``auto`` picks by problem shape; ``graphs``: the solve's graphs)."""
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
    blocks = len(blocks_of((graphs or GraphProvider(req.model, req.seq_len)).graph(1)))
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
                     s.virtual_stages, s.expert_parallel, s.optimizer_offload, s.dp_shard)


def _uniform(req: PlanRequest, ev: UniformEvaluator, runnable: set[Candidate],
             target: Target | None = None) -> PlanResult:
    """The best of every uniform strategy a target runs, each priced by the whole-plan evaluator:
    the fastest that fits (max-throughput); the least memory within ``(1 + max_slowdown)`` of it,
    or the least ``memory + alpha·time`` (min-memory)."""
    cands = sorted(runnable, key=lambda c: (c.tp, c.pp, c.dp, c.zero, c.sp, c.recompute.value, c.micro_batch,
                                            c.schedule.value, c.virtual, c.ep))
    fastest = fastest_fitting(ev, cands, req.budget_bytes)
    if fastest is None or not fastest.fits:
        # none fits: the same strategies with part of the optimizer on the host (targets.offload_variants)
        offloading = offload_variants(target or req.target, cands) if req.optimizer_offload else []
        found = fastest_fitting(ev, offloading, req.budget_bytes) if offloading else None
        if found is not None and found.fits:
            fastest, cands = found, offloading
    if fastest is None or not fastest.fits:
        return _infeasible(req, fastest.memory.peak_bytes if fastest else None,
                           SolverReport("uniform", "infeasible", candidates=len(cands)))
    best = fastest
    if req.objective == "min-memory":
        best = least_memory_within(ev, cands, req.budget_bytes, objective_of(req), fastest.time.step_seconds) or fastest
    note = f"exhaustive over the {len(cands)} uniform strategies target {(target or req.target).value} runs"
    return _uniform_result(best, SolverReport("uniform", "optimal", candidates=len(cands),
                                              best_time_seconds=fastest.time.step_seconds, note=note))


def _dp(req: PlanRequest, report: ProgressFn, megatron: Evaluation | None, graphs: GraphProvider,
        options: SpaceOptions | None = None) -> Searched:
    from parplan.solver.cost.plan_memory import layer_plan
    from parplan.solver.dp.search import search

    reference = None
    if megatron is not None and megatron.fits:
        reference = layer_plan(graphs.graph(megatron.strategy.micro_batch), megatron.strategy)
    res = search(graphs.graph, req.cluster, global_batch=req.global_batch,
                 objective=req.objective, budget_bytes=req.budget_bytes, max_slowdown=req.max_slowdown,
                 alpha_gib_per_s=req.alpha, calibration=req.calibration, reference=reference,
                 timeout_seconds=req.time_limit_seconds, progress=report, pareto=req.pareto, graph_costs=graphs.costs,
                 options=options, precision=req.precision, micro_batch=req.micro_batch)
    if res.plan is None:
        return Searched(_infeasible(req, res.least, SolverReport("dp", "infeasible", candidates=res.candidates,
                                                                 work=res.work)))
    solver = SolverReport(
        "dp", "optimal", candidates=res.candidates, best_time_seconds=res.best_seconds, work=res.work,
        details={"pareto": "complete" if req.pareto else "partial", "search_seconds": res.seconds},
        note="exact per stage for the memory granularity (1/512 of the budget); pipeline degree, "
             "micro-batch count and partition searched over candidates")
    frontier_note = SolverReport("dp", "optimal", note="a point of the DP's Pareto frontier")
    ev, cl, cal = res.evaluator, req.cluster, req.calibration
    return Searched(
        per_layer_result(res.plan, ev, cl, cal, solver),
        tuple(Known("dp frontier", secs, peak, functools.partial(per_layer_result, plan, ev, cl, cal, frontier_note))
              for secs, peak, plan in res.frontier),
        tuple(ParetoPoint(secs, peak, plan_summary(plan)) for secs, peak, plan in res.frontier))

"""The ILP search: candidate meshes, the three objectives, extraction and a certificate.

For a request it builds the graph of one micro-step (``b`` samples over the whole mesh, ``m`` of them
per step), and for every candidate mesh (1-D, 2-D, 3-D; see
:func:`~parplan.solver.ilp.strategies.mesh_shapes`) the auxiliary problem. Then:

1. best time: minimise step time subject to per-device memory ≤ budget on each mesh; ``T*`` is the
   best over meshes. Candidates are solved in order of their least possible time; one whose least
   possible time is within the solver's gap (``MIP_REL_GAP``) of the best found so far is not
   solved (it cannot tell a different ``T*`` at the precision the solves have);
2. ``max-throughput`` keeps that plan; ``min-memory`` minimises memory subject to time ≤ (1 + ε)·T*
   (or memory + α·time when α is given) on every mesh that can reach that time, skipping those
   whose least possible memory (the model states and the largest moment's least value,
   :meth:`~parplan.solver.ilp.model.AuxProblem.memory_lower_bound`) is no better than the best so far;
3. when nothing fits, it says so and reports the least memory any plan needs (memory alone,
   minimised without constraints).

A candidate's problem is built in two halves (:func:`~.problem.build_choices`, then
:func:`~.problem.complete_problem`): the candidates and their prices first, which give the least
possible time and a weaker least memory (the model states, no moments); the edges and the moments,
most of the cost, only for a candidate that these bounds do not rule out.

The ILP's memory is the step's busiest moment (the model states and the walk's moments as linear
terms, :mod:`.moments`). The answer is re-priced independently of the solver's encoding (the
*certificate*): the model states, activations and time recomputed over every original operator and
edge, and the peak and temporaries by the whole-plan evaluator's own walk over every unit at the
chosen strategies. Those are the figures reported; the solver's own are shown beside them
(``solver.ilp_memory_bytes``, ``solver.ilp_seconds``) and must agree to rounding.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from parplan.solver.calibration import apply
from parplan.solver.cluster import Cluster, DeviceMesh, Link, MeshLinks
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.activations import tensor_bytes as elem_bytes
from parplan.solver.cost.memory import MemoryBreakdown
from parplan.solver.cost.precision import get_precision
from parplan.solver.cost.resharding import edge_seconds, reshard_seconds
from parplan.solver.cost.rules import search_recomputes
from parplan.solver.cost.runtime import Runtime
from parplan.solver.device_memory import verdict
from parplan.solver.errors import SolverError
from parplan.solver.ilp.backends import SCREEN_REL_GAP
from parplan.solver.ilp.costs import op_cost
from parplan.solver.ilp.model import MIP_REL_GAP, ROW_TOLERANCE, IlpResult, InfeasibleError, kept_peaks, solve_aux
from parplan.solver.ilp.moments import walk_peak
from parplan.solver.ilp.problem import (
    GraphProblem,
    build_choices,
    complete_problem,
    consumer_saves,
    least_bytes,
    partial_saved_bytes,
    resharded_copy_bytes,
)
from parplan.solver.ilp.strategies import Mesh, input_layout, mesh_shapes, partial_gradient_axes
from parplan.solver.ir import Graph
from parplan.solver.objective import Objective
from parplan.solver.progress import ProgressFn
from parplan.solver.result import (
    IntraOperatorStrategy,
    MemoryReport,
    OpChoice,
    PlanResult,
    SolverReport,
    TimeReport,
    UnitChoices,
)
from parplan.solver.time_accuracy import time_accuracy

#: Candidates per operator kept on 3-D meshes (1-D and 2-D meshes keep all: exact).
MAX_STRATEGIES_3D = 16


@dataclass
class Candidate:
    """A (mesh, micro-step size) pair, its auxiliary problem, and its solution when it has one."""

    mesh: Mesh
    gp: GraphProblem
    result: IlpResult | None
    b: int  # samples per micro-step
    fits: bool = True  # False once it is known that no choice here fits the budget

    @property
    def res(self) -> IlpResult:
        assert self.result is not None
        return self.result


@dataclass(frozen=True)
class Certificate:
    """Totals recomputed from the chosen strategies over every original operator and edge."""

    memory: MemoryBreakdown
    redundant: MemoryBreakdown
    seconds: float
    solver_memory: float
    solver_seconds: float
    peak_bytes: float = 0.0  # the model states and the step's busiest moment above them

    @property
    def matches(self) -> bool:
        return (abs(self.peak_bytes - self.solver_memory) <= 1e-6 * max(1.0, self.solver_memory)
                and abs(self.seconds - self.solver_seconds) <= 1e-6 * max(1e-9, self.solver_seconds))


def certify(gp: GraphProblem, choice: dict[str, int]) -> Certificate:
    """Recompute memory (by category) and time from scratch for every operator and edge (the
    document adds the peak by the whole-plan evaluator's walk, :func:`.moments.walk_peak`)."""
    ctx = gp.ctx
    mesh, sizes, graph = ctx.mesh, ctx.mesh.sizes, ctx.graph
    held = MemoryBreakdown()
    redundant = MemoryBreakdown()
    seconds = 0.0
    for n in gp.ops:
        if n.id in gp.follows:
            continue
        c = op_cost(n, gp.strategy_of(n.id, choice), ctx, gp.partial_dims[n.id])
        held, redundant, seconds = held + c.memory, redundant + c.redundant, seconds + c.seconds
    # the readers of a tensor in one unit share its conversion: of the edge classes that read the
    # same tensors, the costliest class counts, each of its edges once (a block's output read by
    # the next block and by the head is two groups; an encoder's output read by every decoder
    # block is converted by each of them)
    reads: dict[tuple[str, str, int], set[str]] = {}
    for src, dst, pos in gp.edges:
        reads.setdefault((gp.rep_of[src], gp.rep_of[dst], pos), set()).add(_origin(gp, src))
    per_class: dict[tuple[str, str, int], float] = {}
    first_read: set[str] = set()
    for src, dst, pos in gp.edges:
        tensor = graph.node(_origin(gp, src))
        total = tensor.numel * elem_bytes(tensor, ctx.precision.activation_bytes)
        strategy = gp.strategy_of(dst, choice)
        dst_layout = input_layout(graph.node(dst), pos, graph, strategy, mesh)
        partial = partial_gradient_axes(graph.node(dst), pos, graph, strategy, mesh)
        cost = ctx.microbatches * edge_seconds(total, gp.out_layout(src, choice), dst_layout, partial, sizes,
                                               ctx.links)
        cls = (gp.rep_of[src], gp.rep_of[dst], pos)
        per_class[cls] = per_class.get(cls, 0.0) + cost
        copy = resharded_copy_bytes(consumer_saves(gp, dst, pos), gp.out_layout(src, choice), dst_layout, sizes)
        if tensor.id not in first_read:  # a partial output is saved as its first reader receives it
            first_read.add(tensor.id)
            copy += partial_saved_bytes(ctx.saved_by_owner.get(tensor.id, ()), gp.out_layout(src, choice),
                                        dst_layout, sizes)
        held = held + MemoryBreakdown(activations=copy)
    groups: dict[frozenset[str], float] = {}
    for cls, secs in per_class.items():
        key = frozenset(reads[cls])
        groups[key] = max(groups.get(key, 0.0), secs)
    seconds += sum(groups.values())
    for owner, opos, user, upos in gp.param_edges:
        owner_node, user_node = graph.node(owner), graph.node(user)
        param = graph.node(owner_node.inputs[opos])
        src_layout = input_layout(owner_node, opos, graph, gp.strategy_of(owner, choice), mesh)
        dst_layout = input_layout(user_node, upos, graph, gp.strategy_of(user, choice), mesh)
        seconds += ctx.microbatches * reshard_seconds(param.numel * ctx.precision.weight_transfer_bytes, src_layout,
                                                      dst_layout, sizes, ctx.links)
    return Certificate(held, redundant, seconds, 0.0, 0.0)


def _origin(gp: GraphProblem, op: str) -> str:
    while op in gp.follows:
        op = gp.follows[op]
    return op


def temporary_bytes(gp: GraphProblem, choice: dict[str, int]) -> float:
    """The temporaries' peak over the step's moments (:mod:`.moments`), with the fixed bytes."""
    return gp.problem.fixed_bytes + max((t.value(gp.problem, choice) for t in gp.temporary_terms), default=0.0)


def peak_bytes(gp: GraphProblem, choice: dict[str, int], states: MemoryBreakdown) -> float:
    """The busiest moment of the step: the model states and the largest moment above them."""
    return states.model_states + gp.problem.fixed_bytes + gp.problem.peak(choice)


def micro_step_batch(global_batch: int, devices: int, micro_batch: int | None) -> int:
    """Samples per micro-step over the whole mesh: ``micro_batch`` per device-group if given, else
    the largest divisor of the global batch not above the device count."""
    if micro_batch is not None:
        if global_batch % micro_batch:
            raise SolverError(f"micro-batch {micro_batch} does not divide the global batch {global_batch}")
        return micro_batch
    return max(d for d in range(1, min(global_batch, devices) + 1) if global_batch % d == 0)


def mesh_links(cluster: Cluster, mesh: Mesh) -> MeshLinks:
    """The link each axis (and group of axes) of ``mesh`` runs its collectives over on ``cluster``."""
    return MeshLinks(DeviceMesh.of(cluster, mesh.axes), cluster)


def distinct_meshes(meshes: list[Mesh], cluster: Cluster) -> list[Mesh]:
    """The meshes that differ by more than the order of their axes.

    Strategies name mesh axes, and every cost depends on an axis only through its size and its
    link; two meshes whose axes have the same (size, link) pairs in another order give the same
    auxiliary problem with the axes renamed (``4x2`` and ``2x4`` inside one node), so one of them
    is enough. The first of each kind is kept."""
    seen: set[tuple[tuple[int, Link], ...]] = set()
    out = []
    for mesh in meshes:
        links = mesh_links(cluster, mesh)
        key = tuple(sorted(((size, links[a]) for a, size in mesh.axes), key=repr))
        if key not in seen:
            seen.add(key)
            out.append(mesh)
    return out


def micro_step_candidates(global_batch: int, devices: int, micro_batch: int | None,
                          smaller: bool = False) -> list[int]:
    """Micro-step sizes to try: the given one, else ``b0``, ``4·b0`` (or ``2·b0``) when it divides
    the global batch, and the whole batch, ``b0`` being the largest divisor not above the device
    count (smaller micro-steps keep fewer activations; larger ones pay per-micro-step collectives
    fewer times and keep the devices busier). ``smaller`` (min-memory) adds ``b0/2`` and ``b0/4``:
    fewer samples than devices, the rest of the mesh splitting each sample's work (on 4 GPUs this
    is what brings gpt-1.7b, -3.6b and -7.5b to the paper's memory within the allowed slowdown)."""
    b0 = micro_step_batch(global_batch, devices, micro_batch)
    if micro_batch is not None:
        return [b0]
    large = next((b0 * k for k in (4, 2) if global_batch % (b0 * k) == 0), global_batch)
    small = {b0 // k for k in (2, 4) if b0 % k == 0} if smaller else set()
    return sorted({*small, b0, min(large, global_batch), global_batch})


@dataclass
class _Run:
    """One search's deadline, progress report and work counts (``solver.work.ilp``, for regression
    tests), and the budget every candidate is held to."""

    report: ProgressFn
    deadline: float
    timeout_seconds: float
    budget_bytes: float
    work: dict[str, int]

    def remaining(self) -> float:
        left = self.deadline - time.perf_counter()
        if left <= 0:
            raise SolverError(f"the ILP search ran out of its {self.timeout_seconds:g} s time limit; raise the limit")
        return left

    def complete(self, c: Candidate) -> float:
        """Build the rest of ``c``'s problem (edges, moments) if not done yet; its least memory."""
        if not c.gp.complete:
            complete_problem(c.gp)
            self.work["problems_completed"] += 1
            self.work["peak_terms"] += len(c.gp.problem.peaks)
            self.work["peak_terms_kept"] += len(kept_peaks(c.gp.problem))
            self.remaining()
        return c.gp.problem.memory_lower_bound()


def search(graph_for: Callable[[int], Graph], cluster: Cluster, *, global_batch: int, micro_batch: int | None,
           objective: str, budget_bytes: float, max_slowdown: float, alpha_gib_per_s: float | None,
           calibration: Any, precision: str = "bf16", flash_attention: bool = True, timeout_seconds: float = 60.0,
           progress: ProgressFn | None = None, max_mesh_dims: int = 3,
           reference_seconds: float | None = None, fixed_mesh: tuple[int, ...] | None = None,
           zero_stages: tuple[int, ...] = (0, 1, 2, 3), runtime: Runtime = Runtime.MEGATRON,
           zero3_per_operator: bool = False) -> PlanResult:
    """Run the ILP search; returns the plan's parts (strategy, memory, time, solver statistics).

    Candidates are (mesh, micro-step size) pairs. ``reference_seconds`` is the step time of the best
    plan found elsewhere (e.g. the baselines): ``min-memory`` then stays within (1 + ε) of the better
    of it and the ILP's own best time when the ILP can reach that, else within (1 + ε) of its own
    best; on each mesh it minimises memory at the smallest micro-step that meets that time."""
    t0 = time.perf_counter()
    cl = apply(cluster, calibration)
    sizes = micro_step_candidates(global_batch, cl.num_devices, micro_batch, smaller=objective == "min-memory")
    prec = get_precision(precision)
    if fixed_mesh is not None:
        meshes = [Mesh(tuple((f"m{i}", size) for i, size in enumerate(fixed_mesh)))]
        if meshes[0].num_devices != cl.num_devices:
            raise SolverError(f"mesh {meshes[0].describe()} does not factor the {cl.num_devices} devices")
    else:
        meshes = distinct_meshes(mesh_shapes(cl.num_devices, cl.gpus_per_node, max_mesh_dims), cl)
    graphs = {b: graph_for(b) for b in sizes}
    run = _Run(progress or (lambda stage, fraction: None), t0 + timeout_seconds, timeout_seconds, budget_bytes,
               {"meshes": len(meshes), "problems_built": 0, "problems_completed": 0, "solves": 0, "variables": 0,
                "constraints": 0, "nonzeros": 0, "peak_terms": 0, "peak_terms_kept": 0, "repricings": 0,
                "time_solves_skipped": 0, "memory_solves_skipped": 0, "memory_solves_tightened": 0,
                "problems_not_built": 0})

    def build(b: int, mesh: Mesh, recompute: Recompute) -> GraphProblem:
        return build_choices(graphs[b], mesh, mesh_links(cl, mesh), cl.gpu, calibration, prec, global_batch // b,
                             recompute, flash_attention, zero_stages=zero_stages,
                             max_strategies=MAX_STRATEGIES_3D if len(mesh.axes) >= 3 else None, runtime=runtime,
                             zero3_per_operator=zero3_per_operator)

    fastest: list[Candidate] = []
    problems: list[Candidate] = []
    for recompute in search_recomputes(runtime, flash_attention):
        floor = {b: least_bytes(graphs[b], cl.num_devices, prec, recompute, flash_attention, runtime) for b in sizes}
        problems = _problems(run, meshes, sizes, floor, functools.partial(build, recompute=recompute))
        fastest = _fastest(run, problems, skip_slow=alpha_gib_per_s is None)
        if fastest:
            break
    if not fastest:
        run.report("solving: least memory", 0.8)
        b_least = min(c.b for c in problems)
        smallest = [c for c in problems if c.b == b_least]
        for c in smallest:
            run.complete(c)
        least = min((Candidate(c.mesh, c.gp, solve_aux(c.gp.problem, "memory", timeout_seconds=run.remaining(),
                                                          work=run.work), c.b)
                     for c in smallest), key=lambda c: c.res.memory)
        return _result(least, cl, "infeasible", time.perf_counter() - t0, meshes, budget_bytes, objective,
                       work=run.work)
    best_time = min(c.res.seconds for c in fastest)
    chosen = min(fastest, key=lambda c: (c.res.seconds, c.res.memory))
    goal = Objective.of(objective, max_slowdown, alpha_gib_per_s)
    if goal.kind == "min-memory":
        reference = min(best_time, reference_seconds) if reference_seconds else best_time
        if best_time > goal.slowdown_limit(reference):
            reference = best_time  # the ILP cannot get within the slowdown of the other plan
        best_time = reference
        chosen = _least_memory(run, goal, problems, fastest, goal.slowdown_limit(reference))
    status = "optimal" if chosen.res.status == "optimal" else "feasible"
    run.report("done", 1.0)
    return _result(chosen, cl, status, time.perf_counter() - t0, meshes, budget_bytes, objective, best_time,
                   tried=len(problems), work=run.work)


def _problems(run: _Run, meshes: list[Mesh], sizes: list[int], floor: dict[int, float],
              build: Callable[[int, Mesh], GraphProblem]) -> list[Candidate]:
    """Every (mesh, micro-step) candidate's choices, but those at a micro-step whose least memory
    (``floor``) exceeds the budget when another's does not."""
    problems = []
    combos = [(mesh, b) for mesh in meshes for b in sizes]
    for i, (mesh, b) in enumerate(combos):
        run.report("building the problems", 0.05 + 0.35 * i / len(combos))
        if floor[b] > run.budget_bytes and any(floor[s] <= run.budget_bytes for s in sizes):
            run.work["problems_not_built"] += 1  # nothing at this micro-step fits, whatever the mesh
            continue
        gp = build(b, mesh)
        gp.problem.floor_bytes = floor[b]
        run.work["problems_built"] += 1
        problems.append(Candidate(mesh, gp, None, b))
        run.remaining()
    return problems


def _fastest(run: _Run, problems: list[Candidate], skip_slow: bool) -> list[Candidate]:
    """The candidates solved for their best time within the budget, least possible time first (the
    fastest is found early and the others are skipped against it).

    A time solve stops within MIP_REL_GAP of its optimum, so a candidate whose least possible time
    is within that gap of the best time found so far cannot tell a different best time: with
    ``skip_slow`` (max-throughput and min-memory without alpha) its time solve is skipped;
    min-memory then asks it for a plan within the time limit directly."""
    fastest: list[Candidate] = []
    order = sorted(problems, key=lambda c: c.gp.problem.seconds_lower_bound())
    for i, c in enumerate(order):
        run.report("solving: best time", 0.4 + 0.2 * i / len(order))
        # (the bound without the moments first: it needs no more of the problem, and never
        # exceeds the whole one)
        if c.gp.problem.memory_lower_bound() > run.budget_bytes:
            c.fits = False  # even the least memory any choice needs exceeds the budget
            continue
        best = min((f.res.seconds for f in fastest), default=None)
        if skip_slow and best is not None and c.gp.problem.seconds_lower_bound() >= best * (1 - MIP_REL_GAP):
            run.work["time_solves_skipped"] += 1
            continue
        if run.complete(c) > run.budget_bytes:
            c.fits = False
            continue
        try:
            c.result = solve_aux(c.gp.problem, "time", budget=run.budget_bytes, timeout_seconds=run.remaining(),
                                 work=run.work)
        except InfeasibleError:
            c.fits = False
            continue
        fastest.append(c)
    return fastest


def _least_memory(run: _Run, goal: Objective, problems: list[Candidate], fastest: list[Candidate],
                  limit: float) -> Candidate:
    """``min-memory``: the least memory (or ``memory + alpha·time``) over the candidates that can
    meet the time ``limit`` (the slowdown's, with alpha too; a memory solve's limit is the
    objective's).

    Every candidate that can meet the limit (solved within it, or not solved and not ruled out by
    its least possible time), smallest micro-steps (fewest activations) first; each later solve
    only looks for a plan better than the best so far (a memory solve holds its step below the
    limit by the solver's tolerance, ROW_TOLERANCE: a time-solved candidate closer to the limit
    than that has no plan for it). Memory solves screen first, to SCREEN_REL_GAP, then
    :func:`_tighten` proves the answer to MIP_REL_GAP."""
    solved_limit = limit * (1 - 2 * ROW_TOLERANCE)
    within = sorted((c for c in problems if c.fits and (c.res.seconds <= solved_limit if c.result is not None
                                                        else c.gp.problem.seconds_lower_bound() <= limit)),
                    key=lambda c: (c.b, c.gp.problem.memory_lower_bound()))
    # the best-time plans within the limit are plans of this objective too: their memory is the
    # first cutoff, so every memory solve looks only for a plan that holds less
    pool: list[Candidate] = [] if goal.weighted else [
        Candidate(c.mesh, c.gp, replace(c.res, objective=c.res.memory), c.b)
        for c in fastest if c.res.seconds <= limit]
    screened: list[Candidate] = []
    for i, c in enumerate(within):
        run.report("solving: least memory within the time limit", 0.6 + 0.3 * i / len(within))
        cutoff = min((p.res.objective for p in pool), default=None)
        # the bound without the moments first, then the whole problem's
        if cutoff is not None and not goal.weighted and c.gp.problem.memory_lower_bound() >= cutoff:
            run.work["memory_solves_skipped"] += 1
            continue  # even the lower memory any choice here needs is no better than the best so far
        lower = run.complete(c)
        if lower > run.budget_bytes:
            continue  # no choice here fits (known once the moments are in)
        if cutoff is not None and not goal.weighted and lower >= cutoff:
            run.work["memory_solves_skipped"] += 1
            continue
        start = c.res.choice if c.result is not None else None
        try:
            if goal.alpha_bytes_per_s is not None:
                r = solve_aux(c.gp.problem, "weighted", alpha=goal.alpha_bytes_per_s, budget=run.budget_bytes,
                              timeout_seconds=run.remaining(), cutoff=cutoff, work=run.work)
            else:
                r = _memory_solve(run, goal, c, limit, cutoff, start, SCREEN_REL_GAP)
        except InfeasibleError:
            if cutoff is None and start is not None:
                raise
            continue  # nothing here beats the best so far (or meets the time limit)
        pool.append(Candidate(c.mesh, c.gp, r, c.b))
        screened.append(pool[-1])
    if not goal.weighted:
        _tighten(run, goal, limit, pool, screened)
    return min(pool, key=lambda c: (c.res.objective, c.res.seconds))


def _memory_solve(run: _Run, goal: Objective, c: Candidate, limit: float, cutoff: float | None,
                  start: dict[str, int] | None, gap: float) -> IlpResult:
    """``c``'s least memory within the time ``limit`` (better than ``cutoff``), to ``gap``."""
    return solve_aux(c.gp.problem, "memory", budget=run.budget_bytes, time_limit=goal.tolerant(limit),
                     timeout_seconds=run.remaining(), start=start, cutoff=cutoff, work=run.work, gap=gap)


def _tighten(run: _Run, goal: Objective, limit: float, pool: list[Candidate], screened: list[Candidate]) -> None:
    """Prove the least memory to MIP_REL_GAP: every screened candidate whose proven least memory
    leaves room for a plan better than the best so far by more than that gap is solved again to
    it, looking only for such a plan (the lowest bound first; a better plan joins ``pool``). The
    others cannot hold a plan better than the answer by more than the gap, as with every candidate
    solved to it directly. The answer's gap is then at most MIP_REL_GAP."""
    for c in sorted(screened, key=lambda c: c.res.least_possible):
        best = min(p.res.objective for p in pool)
        if c.res.least_possible >= best * (1 - MIP_REL_GAP):
            continue
        run.work["memory_solves_tightened"] += 1
        try:
            r = _memory_solve(run, goal, c, limit, best, None, MIP_REL_GAP)
        except InfeasibleError:
            continue  # nothing here better than the best by more than the gap
        pool.append(Candidate(c.mesh, c.gp, r, c.b))
    chosen = min(pool, key=lambda c: (c.res.objective, c.res.seconds))
    if chosen.res.gap is not None and chosen.res.gap > MIP_REL_GAP:
        chosen.result = replace(chosen.res, gap=MIP_REL_GAP)  # proven above, over every candidate


def _result(c: Candidate, cluster: Cluster, status: str, seconds: float, meshes: list[Mesh], budget: float,
            objective: str, best_time: float | None = None, tried: int = 0,
            work: dict[str, int] | None = None) -> PlanResult:
    """The candidate's plan, re-priced by the certificate (its strategy, memory, time, solver report)."""
    gp, r = c.gp, c.res
    work = dict(work or {})
    work["repricings"] = work.get("repricings", 0) + 1  # the certificate and the walk, once, at the answer
    graph, b = gp.ctx.graph, c.b
    m = gp.ctx.microbatches
    cert = certify(gp, r.choice)
    above, temporary = walk_peak(gp, r.choice)  # the evaluator's walk over every unit at this choice
    cert = Certificate(cert.memory.replace(temporary=temporary), cert.redundant, cert.seconds, r.memory, r.seconds,
                       cert.memory.model_states + above)
    seq = int(graph.meta.get("seq_len", 0) or 0)
    tokens = b * m * seq
    strategy = IntraOperatorStrategy(
        summary=f"mesh {c.mesh.describe()} ({', '.join(f'{a}={s}' for a, s in c.mesh.axes)}), "
                f"{m} micro-steps of {b} samples, recompute {gp.ctx.recompute.value}",
        mesh_axes=tuple(c.mesh.axes), micro_step_batch=b, num_microbatches=m, recompute=gp.ctx.recompute.value,
        flash_attention=gp.ctx.flash_attention, precision=gp.ctx.precision.name, units=_unit_choices(c))
    memory = MemoryReport(cert.peak_bytes, verdict(cert.peak_bytes, cluster),
                          cluster.device_memory_bytes, cert.memory, cert.redundant, budget_bytes=budget)
    step = cert.seconds
    times = TimeReport(step, tokens / step if step else 0.0, b * m / step if step else 0.0,
                       gp.ctx.calibration.source,
                       time_accuracy(gp.ctx.calibration, cluster.gpu.name, gp.ctx.runtime.value))
    details = {
        "backend": r.backend, "objective": objective, "ilp_objective": r.objective,
        "meshes_tried": [mm.describe() for mm in meshes], "candidates_solved": tried,
        "aux_graph": {"vertices": gp.problem.size[0], "edges": gp.problem.size[1],
                      "operators": len(gp.ops), "variables_shared": len(gp.ops) - len(gp.problem.nodes)},
        "ilp_memory_bytes": r.memory, "ilp_seconds": r.seconds,
        "certificate": {"memory_bytes": cert.peak_bytes, "seconds": cert.seconds, "matches": cert.matches},
    }
    solver = SolverReport("ilp", status, r.gap, best_time_seconds=best_time, always_best_time=True, details=details,
                          work={"ilp": work}, seconds=seconds)
    return PlanResult(strategy, memory, times, solver)


def _unit_choices(c: Candidate) -> tuple[UnitChoices, ...]:
    """Each repeated unit's operators and their strategies, in the order of the graph."""
    gp, r, graph = c.gp, c.res, c.gp.ctx.graph
    by_rep: dict[str, list[str]] = {}
    unit_of_rep: dict[str, str] = {}
    for n in gp.ops:
        rep = gp.rep_of[n.id]
        unit_of_rep.setdefault(rep, graph.node(rep).layer or "")
        by_rep.setdefault(rep, [])
        if n.layer not in by_rep[rep]:
            by_rep[rep].append(n.layer or "")
    groups: dict[str, tuple[list[str], list[OpChoice]]] = {}
    for rep, layers in by_rep.items():
        _, ops = groups.setdefault(unit_of_rep[rep], (layers, []))
        if rep in gp.follows:
            ops.append(OpChoice(rep, "follows " + gp.follows[rep]))
            continue
        s = gp.strategies[rep][r.choice[rep]]
        ops.append(OpChoice(rep, s.describe(c.mesh), s.zero,
                            tuple((a, d) for a, d in zip(c.mesh.names, s.assignment, strict=True) if d)))
    return tuple(UnitChoices(names[0] if len(names) == 1 else f"{names[0]} .. {names[-1]}", len(names), key,
                             tuple(ops)) for key, (names, ops) in groups.items())

"""Plan requests: parse and validate them (cheap, safe in a request path), and solve them.

``parse_plan_request`` takes the HTTP body shape of DESIGN.md (also built by the CLI) and raises
:class:`~parplan.solver.errors.SolverError` subclasses with a ``field`` for anything invalid, so a
service can answer 422 before a job exists. ``solve`` runs the search (seconds to minutes) and
returns the plan document whose keys DESIGN.md fixes (the same as ``parplan plan --json``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import time
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass
from typing import Any, Literal

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
from parplan.solver.calibration import DEFAULT_CALIBRATION, Calibration
from parplan.solver.cluster import Cluster, make_cluster
from parplan.solver.cost.pipeline import blocks_of
from parplan.solver.cost.precision import PRECISIONS
from parplan.solver.dp.space import SpaceOptions
from parplan.solver.errors import ConfigError, SolverError
from parplan.solver.evaluate import Evaluation, GraphProvider
from parplan.solver.frontends.presets import get_preset
from parplan.solver.models import ModelSource, model_from_json
from parplan.solver.objective import Objective as ObjectiveRule
from parplan.solver.progress import ProgressFn
from parplan.solver.result import (
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
from parplan.solver.targets import SPECS, Target, runnable

Objective = Literal["min-memory", "max-throughput"]
Search = Literal["auto", "ilp", "dp"]

#: Limits that keep one request within what a worker can solve (also enforced by the service).
MAX_DEVICES = 1 << 17
MAX_GLOBAL_BATCH = 1 << 24


class RequestError(ConfigError):
    """A plan request field is invalid; ``field`` is its dotted location in the request body."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


@dataclass(frozen=True)
class PlanRequest:
    """A validated plan request. Sizes in samples/tokens; memory in bytes; time in seconds."""

    model: ModelSource
    cluster: Cluster
    global_batch: int
    seq_len: int
    micro_batch: int | None = None
    objective: Objective = "min-memory"
    alpha: float | None = None
    max_slowdown: float = 0.1
    memory_budget_bytes: int | None = None
    search: Search = "auto"
    time_limit_seconds: float = 60.0
    calibration: Calibration = DEFAULT_CALIBRATION
    mesh: tuple[int, ...] | None = None  # fix the ILP's device mesh (sizes, outermost first)
    pareto: bool = False  # the DP's whole memory vs step-time frontier (else: only down to the answer)
    target: Target = Target.ANY  # the trainer the plan is for (parplan.solver.targets)
    precision: str = "bf16"  # parplan.solver.cost.precision.PRECISIONS

    @property
    def budget_bytes(self) -> int:
        """Memory each device may use: the budget if given, else the device's memory."""
        return self.memory_budget_bytes or self.cluster.device_memory_bytes


def _int(body: Mapping[str, Any], key: str, where: str, default: int | None = None, lo: int = 1,
         hi: int | None = None) -> int | None:
    v = body.get(key)
    if v is None:
        v = default
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise RequestError(f"{where}.{key}", f"expected an integer, got {v!r}")
    if v < lo or (hi is not None and v > hi):
        raise RequestError(f"{where}.{key}", f"must be between {lo} and {hi}" if hi else f"must be >= {lo}")
    return v


#: Largest memory a request may name, GiB (a device or a budget).
MAX_MEMORY_GIB = float(2**20)


def _num(body: Mapping[str, Any], key: str, where: str, default: float | None,
         hi: float | None = None) -> float | None:
    v = body.get(key)
    if v is None:
        v = default
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or v != v or v < 0:
        raise RequestError(f"{where}.{key}", f"expected a non-negative number, got {v!r}")
    if hi is not None and v > hi:
        raise RequestError(f"{where}.{key}", f"must be at most {hi:g}")
    return float(v)


def model_from_spec(spec: Any) -> ModelSource:
    """The model of a request's ``model`` object (RequestError naming the field when it is bad)."""
    if not isinstance(spec, Mapping) or len(spec) != 1:
        raise RequestError("model", "give exactly one of preset, hf_config, graph")
    (kind, value), = spec.items()
    try:
        if kind == "preset":
            if not isinstance(value, str):
                raise RequestError("model.preset", "expected a preset name")
            cfg = get_preset(value)
            return ModelSource(cfg.name, config=cfg)
        if kind in ("hf_config", "graph"):
            if not isinstance(value, Mapping):
                raise RequestError(f"model.{kind}", "expected a JSON object")
            return model_from_json(dict(value), name=str(value.get("name") or value.get("_name_or_path") or kind))
    except RequestError:
        raise
    except SolverError as e:
        raise RequestError(f"model.{kind}", str(e)) from None
    raise RequestError("model", f"unknown model kind {kind!r}; give preset, hf_config or graph")


def parse_plan_request(body: Mapping[str, Any], calibration: Calibration = DEFAULT_CALIBRATION, *,
                       model: ModelSource | None = None) -> PlanRequest:
    """Validate a request body (DESIGN.md's shape) into a :class:`PlanRequest`. Raises RequestError.

    ``model``, when given, is what ``body["model"]`` reads as, already read and validated (the CLI's
    traced graph): it is used instead of reading the body's copy again."""
    if not isinstance(body, Mapping):
        raise RequestError("body", "expected a JSON object")
    model = model if model is not None else model_from_spec(body.get("model"))
    cl = body.get("cluster") or {}
    if not isinstance(cl, Mapping):
        raise RequestError("cluster", "expected an object")
    gpus = _int(cl, "gpus", "cluster", hi=MAX_DEVICES)
    if gpus is None:
        raise RequestError("cluster.gpus", "required")
    try:
        cluster = make_cluster(gpus, _int(cl, "gpus_per_node", "cluster"), str(cl.get("gpu") or "A100-80GB"),
                               _num(cl, "gpu_memory_gib", "cluster", None, MAX_MEMORY_GIB))
    except ConfigError as e:
        raise RequestError("cluster", str(e)) from None
    tr = body.get("training") or {}
    if not isinstance(tr, Mapping):
        raise RequestError("training", "expected an object")
    seq = _int(tr, "seq_len", "training", default=model.default_seq_len)
    gb = _int(tr, "global_batch", "training", default=max(gpus, 1), hi=MAX_GLOBAL_BATCH)
    mb = _int(tr, "micro_batch", "training")
    precision = _precision(tr, cluster)
    ob = body.get("objective") or {}
    if not isinstance(ob, Mapping):
        raise RequestError("objective", "expected an object")
    kind_text = ob.get("kind") or "min-memory"
    if kind_text not in ("min-memory", "max-throughput"):
        raise RequestError("objective.kind", "must be min-memory or max-throughput")
    kind: Objective = "max-throughput" if kind_text == "max-throughput" else "min-memory"
    slowdown = _num(ob, "max_slowdown", "objective", 0.1)
    budget_gib = _num(ob, "memory_budget_gib", "objective", None, MAX_MEMORY_GIB)
    search_text = body.get("search") or "auto"
    searches: dict[str, Search] = {"auto": "auto", "ilp": "ilp", "dp": "dp"}
    if search_text not in searches:
        raise RequestError("search", "must be auto, ilp or dp")
    search = searches[search_text]
    limit = _num(body, "time_limit", "request", 60.0)
    mesh = body.get("mesh")
    if mesh is not None:
        if (not isinstance(mesh, list | tuple) or not 1 <= len(mesh) <= 3
                or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in mesh)):
            raise RequestError("mesh", "expected 1 to 3 positive integers, e.g. [2, 4]")
        if math.prod(mesh) != cluster.num_devices:
            raise RequestError("mesh", f"{'x'.join(map(str, mesh))} = {math.prod(mesh)} devices does not factor "
                                       f"the cluster's {cluster.num_devices}")
    pareto = body.get("pareto", False)
    if not isinstance(pareto, bool):
        raise RequestError("pareto", f"expected true or false, got {pareto!r}")
    target_text = body.get("target") or "any"
    if target_text not in {t.value for t in Target}:
        raise RequestError("target", f"unknown target {target_text!r}; known: {', '.join(t.value for t in Target)}")
    target = Target(target_text)
    spec = SPECS[target]
    if spec.uniform and search != "auto":
        raise RequestError("search", f"target {target.value} runs one strategy for every layer, which parplan "
                                     "searches exhaustively; leave search at auto")
    if search != "auto" and search not in spec.searches:
        raise RequestError("search", f"target {target.value} runs the plans of the {' or '.join(spec.searches)} "
                                     f"search, not {search}")
    if mesh is not None and "ilp" not in spec.searches:
        raise RequestError("mesh", f"a device mesh fixes the ILP's per-operator plans, which target {target.value} "
                                   "does not run")
    assert seq is not None and gb is not None and slowdown is not None and limit is not None
    if limit <= 0:
        raise RequestError("time_limit", "must be > 0 seconds")
    return PlanRequest(model=model, cluster=cluster, global_batch=gb, seq_len=seq, micro_batch=mb, objective=kind,
                       alpha=_num(ob, "alpha", "objective", None), max_slowdown=slowdown,
                       memory_budget_bytes=int(budget_gib * 2**30) if budget_gib else None, search=search,
                       time_limit_seconds=limit, calibration=calibration,
                       mesh=tuple(mesh) if mesh is not None else None, pareto=pareto, target=target,
                       precision=precision)


def _precision(training: Mapping[str, Any], cluster: Cluster) -> str:
    """``training.precision`` (default bf16), which the cluster's GPU must have the math for."""
    name = training.get("precision") or "bf16"
    if not isinstance(name, str) or name not in PRECISIONS:
        raise RequestError("training.precision", f"unknown precision {name!r}; known: {', '.join(PRECISIONS)}")
    prec = PRECISIONS[name]
    try:
        for dtype in {prec.compute_dtype, prec.matmul_dtype or prec.compute_dtype}:
            cluster.gpu.peak(dtype)
    except ConfigError as e:
        raise RequestError("training.precision", str(e)) from None
    return name


def canonical_request(body: Mapping[str, Any]) -> str:
    """The request as canonical JSON (sorted keys, no spaces) with defaults applied, for hashing."""
    req = parse_plan_request(body)
    doc: dict[str, Any] = {
        "model": dict(body["model"]),
        "cluster": {"gpus": req.cluster.num_devices, "gpus_per_node": req.cluster.gpus_per_node,
                    "gpu": req.cluster.gpu.name, "memory_bytes": req.cluster.device_memory_bytes},
        "training": {"global_batch": req.global_batch, "seq_len": req.seq_len, "micro_batch": req.micro_batch},
        "objective": {"kind": req.objective, "alpha": req.alpha, "max_slowdown": req.max_slowdown,
                      "memory_budget_bytes": req.memory_budget_bytes},
        "search": req.search, "time_limit": req.time_limit_seconds, "mesh": list(req.mesh) if req.mesh else None,
        "pareto": req.pareto,
    }
    if req.target is not Target.ANY:  # requests without a target keep the keys they had
        doc["target"] = req.target.value
    if req.precision != "bf16":  # (and those in bf16 theirs)
        doc["training"]["precision"] = req.precision
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def request_hash(body: Mapping[str, Any]) -> str:
    """sha256 of the canonical request and the solver version (the plan cache key)."""
    return hashlib.sha256(f"{SOLVER_VERSION}\n{canonical_request(body)}".encode()).hexdigest()


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

    mb = None
    if req.micro_batch:
        mb = min(req.global_batch, req.micro_batch * req.cluster.num_devices)
    res = search(graphs.graph, req.cluster, global_batch=req.global_batch,
                 micro_batch=mb if mb and req.global_batch % mb == 0 else None, objective=req.objective,
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
            return out, f"; the ILP stopped ({e}), so the DP's plan"
    return out, ""


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
                          precision=req.precision, runtime=spec.runtime, graphs=graphs)
    num_blocks = len(blocks_of(ev.graph(req.micro_batch or 1)))
    report("baselines", 0.05)
    runs = runnable(req.target, req.cluster, req.global_batch, ev.graph(req.micro_batch or 1))
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
                     s.virtual_stages, s.expert_parallel)


def _uniform(req: PlanRequest, ev: UniformEvaluator, runnable: set[Candidate]) -> PlanResult:
    """The best of every uniform strategy a target runs, each priced by the whole-plan evaluator:
    the fastest that fits (max-throughput); the least memory within ``(1 + max_slowdown)`` of it,
    or the least ``memory + alpha·time`` (min-memory)."""
    cands = sorted(runnable, key=lambda c: (c.tp, c.pp, c.dp, c.zero, c.sp, c.recompute.value, c.micro_batch,
                                            c.schedule.value, c.virtual, c.ep))
    fastest = fastest_fitting(ev, cands, req.budget_bytes)
    if fastest is None or not fastest.fits:
        return _infeasible(req, fastest.memory.peak_bytes if fastest else None,
                           SolverReport("uniform", "infeasible", candidates=len(cands)))
    best = fastest
    if req.objective == "min-memory":
        best = least_memory_within(ev, cands, req.budget_bytes, objective_of(req), fastest.time.step_seconds) or fastest
    note = f"exhaustive over the {len(cands)} uniform strategies target {req.target.value} runs"
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
                 options=options, precision=req.precision)
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

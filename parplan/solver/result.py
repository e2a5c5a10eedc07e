"""A plan result, typed: what every search and the planner return, written as JSON once, here.

:class:`PlanResult` holds a plan's strategy (:data:`StrategyReport`: one uniform strategy, per-layer
strategies, or the ILP's per-operator choices), its :class:`MemoryReport` and :class:`TimeReport`,
the :class:`SolverReport`, and (from the planner) the baselines, the objective, the target and the
Pareto frontier. :func:`plan_document` writes the document whose keys DESIGN.md fixes (the same as
``parplan plan --json``); :func:`evaluation_document` writes one evaluated uniform strategy (``parplan
memory --json`` and each baseline). The documents keep the keys each writer had: a uniform plan's
memory and time list each stage in full, a per-layer plan's stages carry no unit names, the ILP's
memory has its budget and no stages; optional parts are left out exactly where they were.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from parplan.solver.cost.memory import CATEGORIES, MemoryBreakdown
from parplan.solver.device_memory import FitVerdict, HostVerdict, host_verdict, verdict
from parplan.solver.time_accuracy import time_accuracy

if TYPE_CHECKING:
    from parplan.solver.calibration import Calibration
    from parplan.solver.cluster import Cluster
    from parplan.solver.cost.plan_evaluator import LayerPlan, PlanEvaluator, PlanMemory, PlanTime
    from parplan.solver.strategy import ParallelConfig

Document = dict[str, Any]


@dataclass(frozen=True)
class MemoryReport:
    """Per-device memory of a plan, bytes: the most loaded device's peak and its breakdown.

    ``peak_bytes``: the allocated peak; ``verdict``: that peak, the reserved peak the caching allocator
    holds at it and the device's usable memory (:mod:`parplan.solver.device_memory`), whose comparison is
    ``fits``. ``peak_stage``: its pipeline stage (None: the ILP's plans have no pipeline); ``budget_bytes``:
    the budget the ILP searched under (None elsewhere); ``stages``: every stage (None: the ILP's),
    listed with their units and per-micro-batch activations when ``stage_units``."""

    peak_bytes: float
    verdict: FitVerdict
    device_memory_bytes: int
    breakdown: MemoryBreakdown
    redundant: MemoryBreakdown
    peak_stage: int | None = None
    budget_bytes: float | None = None
    stages: PlanMemory | None = None
    stage_units: bool = False
    host: HostVerdict | None = None  # with optimizer offloading: the host memory it takes

    @property
    def fits(self) -> bool:
        """The reserved peak within the device's usable memory (and the offloaded optimizer within the host's)."""
        return self.verdict.fits and (self.host is None or self.host.fits)


@dataclass(frozen=True)
class TimeReport:
    """Step time and throughput of a plan. ``bubble_fraction``: the pipeline's idle share (None:
    not reported, the ILP's); ``stages``: each stage's seconds (uniform strategies), with the
    context- and expert-parallel exchanges listed when ``cp_comm`` / ``ep_comm``."""

    step_seconds: float
    tokens_per_second: float
    samples_per_second: float
    calibration: str
    accuracy: Mapping[str, Any] | None
    bubble_fraction: float | None = None
    stages: PlanTime | None = None
    cp_comm: bool = False
    ep_comm: bool = False


@dataclass(frozen=True)
class UniformStrategy:
    """One strategy for every layer (a baseline, a uniform target's plan, ``parplan memory``)."""

    config: ParallelConfig


@dataclass(frozen=True)
class PerLayerStrategy:
    """The DP's plan: a strategy per layer, a pipeline partition and schedule."""

    plan: LayerPlan


@dataclass(frozen=True)
class OpChoice:
    """One operator's strategy in the ILP's plan (``follows``: it takes another operator's layout)."""

    op: str
    strategy: str
    zero: int | None = None  # None: the operator follows another
    assignment: tuple[tuple[str, str], ...] = ()  # (mesh axis, dim) for each axis that splits a dim


@dataclass(frozen=True)
class UnitChoices:
    """The operators of a repeated unit (``count`` copies named ``units``) and their strategies."""

    units: str
    count: int
    representative: str
    ops: tuple[OpChoice, ...]


@dataclass(frozen=True)
class IntraOperatorStrategy:
    """The ILP's plan: a device mesh, micro-steps and each operator's strategy."""

    summary: str
    mesh_axes: tuple[tuple[str, int], ...]
    micro_step_batch: int
    num_microbatches: int
    recompute: str
    flash_attention: bool
    precision: str
    units: tuple[UnitChoices, ...]


StrategyReport = UniformStrategy | PerLayerStrategy | IntraOperatorStrategy


@dataclass(frozen=True)
class SolverReport:
    """How a plan was found. ``best_time_seconds``: the search's fastest plan (s), written when not
    None or when ``always_best_time`` (the ILP writes it, null when nothing fits); ``candidates``,
    ``note``: written when not None; ``details``: the search's own statistics (the ILP's backend,
    auxiliary graph and certificate; the DP's frontier completeness), written as they are;
    ``work``: counts of the work done (deterministic, for regression tests); ``seconds``,
    ``version``, ``why``: the planner's, over the whole solve; ``chosen_over``: the searched plan's
    report when another known plan was chosen."""

    method: str
    status: str
    gap: float | None = None
    best_time_seconds: float | None = None
    always_best_time: bool = False
    candidates: int | None = None
    note: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)
    work: Mapping[str, Any] | None = None
    seconds: float | None = None
    version: str | None = None
    why: str | None = None
    chosen_over: SolverReport | None = None


@dataclass(frozen=True)
class ParetoPoint:
    """A plan no other plan beats on both step time and memory."""

    step_seconds: float
    peak_bytes: float
    summary: str


@dataclass(frozen=True)
class ModelReport:
    name: str
    parameters: int
    seq_len: int
    architecture: Mapping[str, Any] | None = None  # what exports need to write the model


@dataclass(frozen=True)
class ObjectiveReport:
    kind: str
    alpha: float | None
    max_slowdown: float
    memory_budget_bytes: float
    fastest_known_seconds: float | None


@dataclass(frozen=True)
class TargetReport:
    """The trainer the plan is for, its runtime, its own baseline (compared in the document)."""

    name: str
    runtime: str
    baseline: str
    unpriced: tuple[str, ...]
    baseline_evaluation: Evaluation | None = None


@dataclass(frozen=True)
class PlanResult:
    """A plan, or the answer that none fits (``strategy``, ``memory``, ``time`` None; then
    ``least_memory_bytes`` and ``message`` say what would be needed)."""

    strategy: StrategyReport | None
    memory: MemoryReport | None
    time: TimeReport | None
    solver: SolverReport | None
    model: ModelReport | None = None
    cluster: Cluster | None = None
    least_memory_bytes: float | None = None
    message: str | None = None
    pareto: tuple[ParetoPoint, ...] | None = None
    baselines: Mapping[str, Evaluation | None] | None = None
    objective: ObjectiveReport | None = None
    target: TargetReport | None = None

    @property
    def feasible(self) -> bool:
        return self.memory is not None and self.time is not None

    def to_document(self) -> Document:
        return plan_document(self)


def per_layer_result(plan: LayerPlan, ev: PlanEvaluator, cluster: Cluster, calibration: Calibration,
                     solver: SolverReport | None = None) -> PlanResult:
    """A per-layer plan priced by ``ev`` on ``cluster``: its strategy, memory and time."""
    from parplan.solver.time_accuracy import time_accuracy

    mem = ev.memory(plan)
    t = ev.time(plan)
    peak = mem.peak_stage
    memory = MemoryReport(peak.peak_bytes, verdict(peak.peak_bytes, cluster),
                          cluster.device_memory_bytes, peak.memory.bytes, peak.memory.redundant, peak_stage=peak.stage,
                          stages=mem)
    times = TimeReport(t.step_seconds, t.tokens_per_second,
                       plan.global_batch / t.step_seconds if t.step_seconds else 0.0, calibration.source,
                       time_accuracy(calibration, cluster.gpu.name, plan.runtime.value),
                       bubble_fraction=t.bubble_fraction)
    return PlanResult(PerLayerStrategy(plan), memory, times, solver)


# ------------------------------------------------------------------ writing


def memory_document(m: MemoryReport) -> Document:
    doc: Document = {"peak_bytes": round(m.peak_bytes)}
    if m.peak_stage is not None:
        doc["peak_stage"] = m.peak_stage
    doc |= {"fits": m.fits, "device_memory_bytes": m.device_memory_bytes,
            "allocated_peak_bytes": round(m.verdict.allocated_peak_bytes),
            "reserved_peak_bytes": m.verdict.reserved_peak_bytes, "usable_bytes": m.verdict.usable_bytes}
    if m.budget_bytes is not None:
        doc["budget_bytes"] = round(m.budget_bytes)
    if m.host is not None:
        doc |= {"host_bytes_per_node": round(m.host.bytes_per_host), "host_memory_bytes": m.host.host_memory_bytes,
                "host_fits": m.host.fits, "host_reason": m.host.reason}
    doc |= {"breakdown": m.breakdown.as_dict(), "redundant": m.redundant.as_dict()}
    if m.stages is not None:
        if m.stage_units:
            doc["stages"] = [{
                "stage": st.stage, "first_unit": st.units[0] if st.units else None,
                "last_unit": st.units[-1] if st.units else None, "peak_bytes": round(st.peak_bytes),
                "breakdown": st.memory.bytes.as_dict(), "redundant": st.memory.redundant.as_dict(),
                "in_flight_microbatches": st.in_flight_microbatches,
                "activation_bytes_per_microbatch": round(st.activation_bytes_per_microbatch),
            } for st in m.stages.stages]
        else:
            doc["stages"] = [{"stage": st.stage, "peak_bytes": round(st.peak_bytes),
                              "breakdown": st.memory.bytes.as_dict(),
                              "in_flight_microbatches": st.in_flight_microbatches} for st in m.stages.stages]
    return doc


def time_document(t: TimeReport) -> Document:
    doc: Document = {"step_seconds": t.step_seconds, "tokens_per_second": t.tokens_per_second,
                     "samples_per_second": t.samples_per_second}
    if t.bubble_fraction is not None:
        doc["bubble_fraction"] = t.bubble_fraction
    doc |= {"calibration": t.calibration, "accuracy": dict(t.accuracy) if t.accuracy is not None else None}
    if t.stages is not None:
        doc["stages"] = [{
            "stage": s.stage, "forward_seconds": s.forward_seconds, "backward_seconds": s.backward_seconds,
            "recompute_seconds": s.recompute_seconds, "tp_comm_seconds": s.tp_comm_seconds,
            "p2p_seconds": s.p2p_seconds, "dp_comm_seconds": s.dp_comm_seconds,
            "dp_exposed_seconds": s.dp_exposed_seconds, "optimizer_seconds": s.optimizer_seconds,
            **({"cp_comm_seconds": s.cp_comm_seconds} if t.cp_comm else {}),
            **({"ep_comm_seconds": s.ep_comm_seconds} if t.ep_comm else {}),
        } for s in t.stages.stages]
    return doc


def uniform_strategy_document(s: ParallelConfig) -> Document:
    return {
        "tp": s.tp, "pp": s.pp, "dp": s.dp, "cp": s.cp, "cp_comm": s.cp_comm, "zero": s.zero,
        "sequence_parallel": s.sequence_parallel,
        "recompute": s.recompute.value, "micro_batch": s.micro_batch,
        "num_microbatches": s.num_microbatches, "global_batch": s.global_batch,
        "schedule": s.schedule.value, "virtual_stages": s.virtual_stages,
        "flash_attention": s.flash_attention, "precision": s.precision,
        "expert_parallel": s.expert_parallel, "runtime": s.runtime.value,
        "sync_every_microbatch": s.sync_every_microbatch, "tp_comm_overlap": s.tp_comm_overlap,
        "overlap_param_gather": s.overlap_param_gather, "overlap_grad_reduce": s.overlap_grad_reduce,
        "pp_scatter_gather": s.pp_scatter_gather,
        **({"optimizer_offload": s.optimizer_offload} if s.optimizer_offload else {}),
        "summary": s.describe(),
    } | ({"partition": list(s.partition)} if s.partition else {}) | (  # blocks per stage, where not even
        {"dp_shard": s.dp_shard} if s.dp_shard else {}) | (  # hybrid sharding's shard group, where set
        # the experts' own tensor-parallel degree, where not tp
        {"expert_tensor_parallel": s.expert_tensor_parallel} if s.expert_tensor_parallel is not None else {})


def plan_summary(plan: LayerPlan) -> str:
    """A per-layer plan in one line: pipeline, micro-batches, partition, the strategies used."""
    kinds = sorted({s.describe() for s in plan.layers.values()})
    split = f"partition {list(plan.partition)}" if plan.partition else "blocks split evenly"
    return f"pp{plan.pp} x {plan.num_microbatches} micro-batches, {split}: " + "; ".join(kinds)


def _stage_of(plan: LayerPlan, index: int) -> int:
    total = 0
    for stage, count in enumerate(plan.partition or [len(plan.layers)]):
        total += count
        if index < total:
            return stage
    return len(plan.partition or [1]) - 1


def per_layer_strategy_document(plan: LayerPlan) -> Document:
    runs: list[Document] = []
    for index, (unit, s) in enumerate(plan.layers.items()):
        text, stage = s.describe(), _stage_of(plan, index)
        if runs and runs[-1]["strategy"] == text and runs[-1]["stage"] == stage:
            runs[-1]["last"] = unit
            runs[-1]["count"] += 1
        else:
            runs.append({"first": unit, "last": unit, "count": 1, "strategy": text, "stage": stage,
                         "tp": s.tp, "dp": s.dp, "zero": s.zero, "sequence_parallel": s.sp,
                         "recompute": s.recompute.value, "tp_inner": s.tp_inner, "expert_parallel": s.ep,
                         "cp": s.cp, "cp_comm": s.cp_comm} | ({"dp_shard": s.dp_shard} if s.dp_shard else {})
                        | ({"expert_tensor_parallel": s.etp} if s.etp else {}))
    return {"kind": "per-layer", "summary": plan_summary(plan), "pp": plan.pp,
            "cp": max(s.cp for s in plan.layers.values()),
            "num_microbatches": plan.num_microbatches, "global_batch": plan.global_batch,
            "partition": list(plan.partition or []), "schedule": plan.schedule.value,
            "layers": runs, "precision": plan.precision, "flash_attention": plan.flash_attention}


def intra_operator_strategy_document(s: IntraOperatorStrategy) -> Document:
    def op(c: OpChoice) -> Document:
        if c.zero is None:
            return {"strategy": c.strategy}
        return {"strategy": c.strategy, "zero": c.zero, "assignment": dict(c.assignment)}

    return {
        "kind": "intra-operator", "summary": s.summary,
        "mesh": {"axes": dict(s.mesh_axes), "shape": [size for _, size in s.mesh_axes]},
        "micro_step_batch": s.micro_step_batch, "num_microbatches": s.num_microbatches,
        "global_batch": s.micro_step_batch * s.num_microbatches,
        "recompute": s.recompute, "flash_attention": s.flash_attention, "precision": s.precision,
        "units": [{"units": u.units, "count": u.count, "representative": u.representative,
                   "ops": {c.op: op(c) for c in u.ops}} for u in s.units],
    }


def strategy_document(s: StrategyReport) -> Document:
    if isinstance(s, UniformStrategy):
        return {"kind": "uniform", **uniform_strategy_document(s.config)}
    if isinstance(s, PerLayerStrategy):
        return per_layer_strategy_document(s.plan)
    return intra_operator_strategy_document(s)


def solver_document(s: SolverReport) -> Document:
    doc: Document = {"method": s.method, "status": s.status, "gap": s.gap}
    if s.best_time_seconds is not None or s.always_best_time:
        doc["best_time_seconds"] = s.best_time_seconds
    if s.candidates is not None:
        doc["candidates"] = s.candidates
    if s.note is not None:
        doc["note"] = s.note
    doc |= dict(s.details)
    if s.work is not None:
        doc["work"] = dict(s.work)
    for key in ("seconds", "version", "why"):
        if getattr(s, key) is not None:
            doc[key] = getattr(s, key)
    if s.chosen_over is not None:
        doc["chosen_over"] = solver_document(s.chosen_over)
    return doc


def cluster_document(c: Cluster) -> Document:
    return {"gpus": c.num_devices, "gpus_per_node": c.gpus_per_node, "gpu": c.gpu.name,
            "device_memory_bytes": c.device_memory_bytes}


def evaluation_document(e: Evaluation) -> Document:
    """One uniform strategy's evaluation (``parplan memory --json``; a plan's baselines)."""
    return {"model": {"name": e.model, "parameters": e.parameters, "seq_len": e.seq_len},
            "cluster": cluster_document(e.cluster), "strategy": uniform_strategy_document(e.strategy),
            "memory": memory_document(e.memory_report()), "time": time_document(e.time_report())}


def _ratio(value: float, base: float) -> float | None:
    """``value / base``; None (JSON null) where the base is 0 (a graph that names no tokens has no
    throughput to compare)."""
    return value / base if base else None


def _relative(r: PlanResult, base: Evaluation | None) -> dict[str, float | None] | None:
    if base is None or r.memory is None or r.time is None:
        return None
    return {"memory": _ratio(round(r.memory.peak_bytes), base.memory.peak_bytes),
            "time": _ratio(r.time.step_seconds, base.time.step_seconds),
            "throughput": _ratio(r.time.tokens_per_second, base.time.tokens_per_second)}


def _target_document(r: PlanResult, t: TargetReport) -> Document:
    """The target and how the answer compares with its own baseline (saved bytes per device and
    seconds per step: positive is better than the baseline)."""
    out: Document = {"name": t.name, "runtime": t.runtime, "baseline": t.baseline, "versus_baseline": None,
                     "unpriced": list(t.unpriced)}
    base = t.baseline_evaluation
    if base is not None and r.memory is not None and r.time is not None:
        peak = round(r.memory.peak_bytes)
        out["versus_baseline"] = {
            "baseline_fits": base.fits,
            "memory_saved_bytes": round(base.memory.peak_bytes - peak),
            "seconds_saved": base.time.step_seconds - r.time.step_seconds,
            "memory_ratio": peak / base.memory.peak_bytes,
            "time_ratio": r.time.step_seconds / base.time.step_seconds}
    return out


def plan_document(r: PlanResult) -> Document:
    """The plan document (DESIGN.md's keys; the same as ``parplan plan --json`` and ``GET /v1/plans/{id}``)."""
    doc: Document = {}
    if r.memory is None or r.time is None or r.strategy is None:
        doc |= {"memory": None, "time": None, "strategy": None, "least_memory": None,
                "least_memory_bytes": round(r.least_memory_bytes) if r.least_memory_bytes is not None else None,
                "message": r.message}
    else:
        doc |= {"strategy": strategy_document(r.strategy), "memory": memory_document(r.memory),
                "time": time_document(r.time)}
        if isinstance(r.strategy, IntraOperatorStrategy):
            doc["categories"] = list(CATEGORIES)
    if r.solver is not None:
        doc["solver"] = solver_document(r.solver)
    if r.pareto is not None:
        doc["pareto"] = [{"step_seconds": p.step_seconds, "peak_bytes": round(p.peak_bytes), "summary": p.summary}
                         for p in r.pareto]
    if r.baselines is not None:
        doc["baselines"] = {n: evaluation_document(b) | {"fits": b.fits} if b else None
                            for n, b in r.baselines.items()}
        if r.feasible:
            doc["relative"] = {n: _relative(r, b) for n, b in r.baselines.items()}
    if r.target is not None:
        doc["target"] = _target_document(r, r.target)
    if r.objective is not None:
        o = r.objective
        doc["objective"] = {"kind": o.kind, "alpha": o.alpha, "max_slowdown": o.max_slowdown,
                            "memory_budget_bytes": o.memory_budget_bytes,
                            "fastest_known_seconds": o.fastest_known_seconds}
    if r.model is not None:
        doc["model"] = {"name": r.model.name, "parameters": r.model.parameters, "seq_len": r.model.seq_len}
        if r.model.architecture is not None:
            doc["model"]["architecture"] = dict(r.model.architecture)
    if r.cluster is not None:
        doc["cluster"] = cluster_document(r.cluster)
    return doc


@dataclass(frozen=True)
class Evaluation:
    """Memory and time of one uniform strategy for one model on one cluster (what ``parplan memory``
    prints, and each baseline of a plan)."""

    model: str
    parameters: int
    seq_len: int
    cluster: Cluster
    strategy: ParallelConfig
    memory: PlanMemory
    time: PlanTime
    calibration: Calibration

    @property
    def host(self) -> HostVerdict | None:
        """The host memory an offloaded optimizer takes (None without offloading)."""
        if not self.strategy.optimizer_offload:
            return None
        return host_verdict(self.memory.host_bytes_per_device, self.cluster)

    @property
    def fits(self) -> bool:
        """The reserved peak within the device's usable memory (:func:`verdict`), and an offloaded
        optimizer within the host's memory."""
        host = self.host
        return verdict(self.memory.peak_bytes, self.cluster).fits and (host is None or host.fits)

    def memory_report(self) -> MemoryReport:
        """The memory of the most loaded device, and of every stage."""
        peak = self.memory.peak_stage
        return MemoryReport(peak.peak_bytes, verdict(peak.peak_bytes, self.cluster), self.cluster.device_memory_bytes,
                            peak.memory.bytes,
                            peak.memory.redundant, peak_stage=peak.stage, stages=self.memory, stage_units=True,
                            host=self.host)

    def time_report(self) -> TimeReport:
        """The step time, throughput and every stage's seconds."""
        s, t = self.strategy, self.time
        return TimeReport(t.step_seconds, t.tokens_per_second,
                          s.global_batch / t.step_seconds if t.step_seconds else 0.0, self.calibration.source,
                          time_accuracy(self.calibration, self.cluster.gpu.name, s.runtime.value),
                          bubble_fraction=t.bubble_fraction, stages=t, cp_comm=s.cp > 1, ep_comm=s.expert_parallel > 1)

    def model_report(self) -> ModelReport:
        return ModelReport(self.model, self.parameters, self.seq_len)

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-able data (keys per docs/design.md's contract)."""
        return evaluation_document(self)

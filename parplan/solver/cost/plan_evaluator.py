"""Memory and step time of a plan whose layers may each use a different strategy.

A :class:`LayerPlan` cuts the blocks into pipeline stages and gives every block a
:class:`LayerStrategy` — its tensor- and data-parallel degrees inside the stage, their nesting
order, the ZeRO stage of its data parallelism, sequence parallelism, recomputation and expert
parallelism (Galvatron-BMW's per-layer decision tree). Units that are not blocks (embedding, LM
head, a T5 encoder's final norm) take the strategy of the block beside them. A uniform
(Megatron-style) strategy is the special case where every block agrees; :mod:`.plan_memory` and
:mod:`.plan_time` evaluate those through this module.

Per stage and device:

- memory: model states of every unit's parameters under that unit's TP/DP/ZeRO (shared
  parameters such as a tied embedding once per stage), activations of one micro-batch times the
  stage's in-flight count, and the temporary peak (see :mod:`.plan_memory`);
- time per micro-batch: every unit's compute and tensor-parallel collectives (its local batch is
  ``global_batch / (m · dp)``), a re-layout all-to-all of the activation between consecutive blocks
  whose layouts differ, and the point-to-point transfers between stages;
- once per step: each unit's gradient synchronisation over its data-parallel group, hidden behind
  that unit's backward of one micro-batch as far as it lasts (ZeRO-3's per-micro-batch weight
  gathers behind that micro-batch's compute), the compute slowed meanwhile by the SMs the
  collective holds (:func:`~parplan.solver.cost.rules.hidden_traffic_seconds`), and Adam's
  memory-bound update.

A step takes ``m·t_max + (Σ_s t_s − t_max)/v`` plus the slowest stage's once-per-step work.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from parplan.solver.calibration import DEFAULT_CALIBRATION, Calibration, apply
from parplan.solver.cluster import Cluster, DeviceMesh, Link
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.backward import BackwardProfile
from parplan.solver.cost.collectives import (
    DataParallelTraffic,
    all_gather_seconds,
    all_reduce_seconds,
    all_to_all_seconds,
    data_parallel_seconds,
    p2p_seconds,
)
from parplan.solver.cost.kernels import collective_sm_share
from parplan.solver.cost.memory import Memory, MemoryBreakdown
from parplan.solver.cost.peak import StageUnit, stage_peak, stage_unit
from parplan.solver.cost.pipeline import in_flight_microbatches, interleaved_rank_order, stage_of_units
from parplan.solver.cost.precision import Precision, get_precision
from parplan.solver.cost.rules import (
    data_parallel_collectives,
    exposed_seconds,
    optimizer_step_seconds,
    optimizer_temporary_bytes,
    parameter_states,
    sharded_copy_seconds,
    weight_gather_exposed_seconds,
)
from parplan.solver.cost.runtime import DataParallelBuffers, Runtime
from parplan.solver.cost.unit_strategy import UnitStrategy
from parplan.solver.cost.units import GraphCosts, OwnedParam, ParamGroup, TimeEnv, UnitCost
from parplan.solver.errors import StrategyError
from parplan.solver.strategy import Schedule, check_context_parallel, check_overlaps


@dataclass(frozen=True)
class LayerStrategy:
    """One block's strategy inside its pipeline stage (``tp * cp * dp`` = the stage's devices)."""

    tp: int = 1
    dp: int = 1
    zero: int = 0  # 0: plain data parallelism; 1, 2: ZeRO; 3: sharded data parallelism (FSDP)
    sp: bool = False
    recompute: Recompute = Recompute.SELECTIVE
    tp_inner: bool = True  # TP ranks are consecutive devices (else the DP ranks are)
    ep: int = 1  # expert-parallel degree (MoE), dividing dp
    cp: int = 1  # context-parallel degree: the sequence split over cp ranks, the same for every block
    cp_comm: str = "p2p"  # how attention exchanges under CP: the ring (p2p) or all-to-alls (a2a, Ulysses)

    def unit(self, flash_attention: bool, runtime: Runtime = Runtime.MEGATRON) -> UnitStrategy:
        return UnitStrategy(tp=self.tp, sp=self.sp, ep=self.ep, recompute=self.recompute,
                            flash_attention=flash_attention, runtime=runtime, cp=self.cp, cp_comm=self.cp_comm)

    @property
    def data_ranks(self) -> int:
        """Ranks that hold the same weights and reduce their gradients together: ``dp x cp``."""
        return self.dp * self.cp

    @property
    def layout_key(self) -> tuple[int, ...]:
        """What decides the layout of the activation between blocks."""
        key = (self.tp, self.dp, self.tp_inner, self.sp, self.ep)
        return (*key, self.cp) if self.cp > 1 else key

    def describe(self) -> str:
        cp = f"cp{self.cp}" + (" a2a" if self.cp_comm == "a2a" else "")
        parts = [f"tp{self.tp}", f"dp{self.dp}"] + ([cp] if self.cp > 1 else [])
        if self.zero:
            parts.append("sdp" if self.zero == 3 else f"zero{self.zero}")
        if self.sp:
            parts.append("sp")
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        if self.tp > 1 and self.dp > 1:
            parts.append("tp-inner" if self.tp_inner else "dp-inner")
        parts.append("ckpt" if self.recompute is Recompute.FULL else self.recompute.value)
        return " ".join(parts)


@dataclass(frozen=True)
class LayerPlan:
    """Pipeline degree, micro-batching, and a strategy per block."""

    pp: int
    num_microbatches: int
    global_batch: int
    layers: Mapping[str, LayerStrategy]
    partition: tuple[int, ...] | None = None
    schedule: Schedule = Schedule.ONE_F_ONE_B
    virtual_stages: int = 1
    flash_attention: bool = True
    precision: str = "bf16"
    runtime: Runtime = Runtime.MEGATRON  # whose buffers the memory counts (see cost.runtime)
    sync_every_microbatch: bool = False  # gradients reduced after every micro-batch, not only the last
    tp_comm_overlap: bool = False  # Megatron-LM's --tp-comm-overlap: TP collectives under the unit's GEMMs
    overlap_param_gather: bool = False  # Megatron-LM's --overlap-param-gather: weight all-gather under forward
    overlap_grad_reduce: bool = True  # gradients reduced under the backward (false: Megatron-LM without the flag)
    pp_scatter_gather: bool = False  # Megatron-LM of 2021-22: hand-offs split over TP, all-gathered after
    _devices: int = field(default=0, compare=False)

    def local_batch(self, s: LayerStrategy) -> int:
        """Samples one data-parallel rank of a block processes per micro-batch."""
        per = self.num_microbatches * s.dp
        if self.global_batch % per:
            raise StrategyError(f"global batch {self.global_batch} is not a multiple of {self.num_microbatches} "
                                f"micro-batches x dp {s.dp}")
        return self.global_batch // per


CostsFor = Callable[[int], GraphCosts]


def unit_temporary_bytes(c: UnitCost, s: LayerStrategy, prec: Precision, is_block: bool,
                         profile: BackwardProfile | None = None, forward_transient: float = 0.0,
                         dp: DataParallelBuffers | None = None) -> float:
    """Buffers one unit adds at its own peak, on top of the stage's resident memory.

    Backward materialises a weight's gradient and its input's gradient before accumulating them
    (the *gradient workspace*); under full recomputation the block's forward is re-run alongside,
    keeping everything an uncheckpointed forward keeps; under ZeRO-3 one gathered copy of the
    block's weights and three unsharded copies of its gradients coexist with the workspace (a bound:
    the DP search adds these per layer; whole-plan memory walks FSDP's backward instead, see
    :mod:`.peak`). A sequence-parallel gather counts with the workspace (backward gathers a column-
    parallel linear's input again while it makes the gradients: the walk has both at once, found by
    ``tests/solver/test_dp_bound.py`` on gpt-1.7b at tp 2 with sequence parallelism); the logits'
    gradient and the context-parallel buffers are peaks of their own. ``profile``: the unit's
    backward as the walk follows it, whose busiest moment (its saved tensors not yet freed and the
    running operator's gradients) may hold more than its saved tensors and the largest workspace
    (an operator's incoming gradient besides its own; found by the same test on gpt-1.7b at dp 2,
    selective recomputation, 18 MiB above); ``forward_transient``: what its forward holds at once
    beyond what it saves. A block that gathers its weights (``dp``) holds at that moment its own
    copy, the next block's prefetched (unless blocks keep theirs from forward), the reduce buffers
    and its unsharded gradients (part of ``profile``'s ``peak_unsharded``), and under full
    recomputation the rebuilt block too (with ZeRO-3 and full recomputation, 3% above on gpt-1.7b, 10% on
    llama-2-7b, in the same test).
    """
    workspace = c.grad_workspace_bytes + c.sp_gather_bytes
    peak = max(workspace + (c.recompute_peak_bytes if s.recompute is Recompute.FULL else 0.0),
               c.logits_grad_bytes, c.cp_buffer_bytes, forward_transient,
               profile.peak - c.act_bytes if profile is not None else 0.0)
    if s.zero >= 3 and is_block:
        peak = max(peak, c.param_elems_all * (prec.param_bytes + 3 * prec.grad_bytes) + workspace)
    if is_block and dp is not None and dp.gathers and profile is not None:
        copies = 1 if dp.kept_from_forward else 2
        peak = max(peak, c.param_elems_all * (copies * prec.param_bytes + dp.reduce_buffers * prec.grad_bytes)
                   + profile.peak_unsharded - c.act_bytes)
    return peak


def stage_extra_temporary_bytes(root_elems: float, tied_elems: float, tied_workspace_elems: float,
                                largest_param_elems: float, zero3: bool,
                                prec: Precision) -> tuple[float, float, float]:
    """(added to every backward peak, a backward peak of its own, the optimizer's peak) for a whole
    stage: under ZeRO-3 the parameters outside the blocks stay gathered for the whole step; a tied
    embedding's gradient from the LM head (whose backward comes first) waits through the rest of
    backward for the embedding's own, then both and their sum coexist; Adam's update (PyTorch's
    reference implementation) works on two temporaries the size of the largest tensor."""
    root = root_elems * prec.param_bytes if zero3 else 0.0
    always = root + tied_elems * prec.grad_bytes
    tied_peak = root + (2 * tied_elems + tied_workspace_elems) * prec.grad_bytes if tied_elems else 0.0
    return always, tied_peak, optimizer_temporary_bytes(largest_param_elems, prec)


def model_states(groups: Mapping[ParamGroup, float], s: LayerStrategy, prec: Precision,
                 shards_parameters: bool | None = None) -> Memory:
    """Weights, gradients and optimizer states of parameter elements, with ZeRO over the data
    axes: dense parameters shard over all ``dp x cp`` ranks, expert parameters over ``dp x cp / ep``
    (Megatron-LM's distributed optimizer shards over the data-and-context-parallel group).
    ``shards_parameters``: whether the weights are sharded between steps (default: ZeRO-3; the
    runtime decides, see :meth:`~parplan.solver.cost.runtime.Runtime.data_parallel`)."""
    total = Memory(MemoryBreakdown(), MemoryBreakdown())
    for group, elems in groups.items():
        nz = _group_ranks(s, group.expert)
        replicas = (s.tp if group.tp_replicated else 1) * nz
        total = total + Memory(*parameter_states(elems, prec, s.zero, nz, replicas, shards_parameters))
    return total


@dataclass(frozen=True)
class StageMemory:
    """One pipeline stage: per-device bytes, activations of one micro-batch, in-flight count."""

    stage: int
    units: tuple[str, ...]
    memory: Memory
    activation_bytes_per_microbatch: float
    in_flight_microbatches: float
    #: the most the stage holds at one moment of the step (see :mod:`.peak`); at most the sum of
    #: the categories' own peaks
    peak_bytes: float


@dataclass(frozen=True)
class PlanMemory:
    stages: tuple[StageMemory, ...]

    @property
    def peak_stage(self) -> StageMemory:
        """The most loaded stage (the first when several tie)."""
        return max(self.stages, key=lambda s: (s.peak_bytes, -s.stage))

    @property
    def peak_bytes(self) -> float:
        return self.peak_stage.peak_bytes


@dataclass(frozen=True)
class StageTime:
    """Seconds one micro-batch spends on a stage, and the stage's once-per-step costs."""

    stage: int
    forward_seconds: float
    backward_seconds: float
    recompute_seconds: float
    tp_comm_seconds: float
    p2p_seconds: float
    dp_comm_seconds: float  # data-parallel network traffic per step
    dp_exposed_seconds: float  # what it adds to the step: the traffic compute does not hide, FSDP2's copies
    optimizer_seconds: float
    relayout_seconds: float = 0.0
    cp_comm_seconds: float = 0.0  # the context-parallel exchange (ring or all-to-all) compute does not hide
    ep_comm_seconds: float = 0.0  # expert parallelism: the tokens' all-to-alls to their experts and back

    @property
    def microbatch_seconds(self) -> float:
        return (self.forward_seconds + self.backward_seconds + self.recompute_seconds + self.tp_comm_seconds
                + self.p2p_seconds + self.relayout_seconds + self.cp_comm_seconds + self.ep_comm_seconds)

    @property
    def step_seconds(self) -> float:
        """Once-per-step work: exposed gradient traffic and the optimizer."""
        return self.dp_exposed_seconds + self.optimizer_seconds


@dataclass(frozen=True)
class PlanTime:
    stages: tuple[StageTime, ...]
    step_seconds: float
    tokens_per_step: int
    num_microbatches: int

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_per_step / self.step_seconds if self.step_seconds > 0 else 0.0

    @property
    def bubble_fraction(self) -> float:
        busy = max(s.microbatch_seconds for s in self.stages)
        return 0.0 if self.step_seconds <= 0 else max(0.0, 1 - busy * self.num_microbatches / self.step_seconds)


def _group_ranks(s: LayerStrategy, expert: bool) -> int:
    """Ranks a parameter's gradients are reduced over: ``dp x cp``, of an expert's ``/ ep``."""
    return s.data_ranks // s.ep if expert else s.data_ranks


def pipeline_seconds(per_microbatch: list[float], once: list[float], m: int, v: int) -> float:
    """Step time from each stage's per-micro-batch and once-per-step seconds."""
    t_max = max(per_microbatch)
    return m * t_max + (sum(per_microbatch) - t_max) / v + max(once)


def shared_evaluator(gc: GraphCosts, cluster: Cluster | None,
                     calibration: Calibration = DEFAULT_CALIBRATION) -> PlanEvaluator:
    """One evaluator per graph (priced for one micro-batch), cluster and calibration, kept on the
    graph's costs so that evaluations of uniform strategies share its caches."""
    for c, cal, ev in gc.evaluators:
        if c is cluster and cal is calibration:
            return ev  # type: ignore[no-any-return]
    ev = PlanEvaluator(lambda b: gc, cluster, calibration)
    gc.evaluators.append((cluster, calibration, ev))
    return ev


#: what a whole-plan evaluation returns (memory or time)
_Priced = TypeVar("_Priced", PlanMemory, PlanTime)


def plan_key(plan: LayerPlan) -> tuple[Any, ...]:
    """Everything a plan's memory and time depend on, hashable (two plans with equal keys are
    priced the same)."""
    return (plan.pp, plan.num_microbatches, plan.global_batch, plan.partition, plan.schedule, plan.virtual_stages,
            plan.flash_attention, plan.precision, plan.runtime, plan.sync_every_microbatch,
            plan.tp_comm_overlap, plan.overlap_param_gather, plan.overlap_grad_reduce, plan.pp_scatter_gather,
            tuple(plan.layers.items()))


class PlanEvaluator:
    """Evaluates plans of one model on one cluster; caches unit costs across plans.

    Whole-plan answers are kept per plan (:func:`plan_key`), and what one unit contributes to its
    stage under one strategy per structurally alike unit (units that use no parameter another unit
    shares; the others are priced in place, in order): the stage sums add the same numbers in the
    same order, so every figure is the one an uncached walk gives. ``work`` counts the whole-plan
    evaluations asked for and those computed."""

    def __init__(self, costs_for: CostsFor, cluster: Cluster | None,
                 calibration: Calibration = DEFAULT_CALIBRATION, cache: bool = True) -> None:
        self.costs_for = costs_for
        self.cache = cache  # False: every plan and unit priced afresh (the oracle the tests compare with)
        self._cluster = apply(cluster, calibration) if cluster is not None else None
        self.calibration = calibration
        self._meshes: dict[tuple[int, LayerStrategy], DeviceMesh] = {}
        self._experts: dict[str, int] = {}  # unit -> experts per MoE layer in it (0: none)
        self._cp_checked: set[tuple[int, int, str]] = set()  # (tp, cp, cp_comm) the model allows
        self._envs: dict[tuple[int, LayerStrategy, str], TimeEnv] = {}
        self._plan_memory: dict[tuple[Any, ...], PlanMemory] = {}
        self._plan_time: dict[tuple[Any, ...], PlanTime] = {}
        self._unit_memory: dict[tuple[Any, ...], tuple[StageUnit, tuple[float, ...], bool, float, float, float]] = {}
        self._unit_time: dict[tuple[Any, ...], tuple[float, ...]] = {}
        self._relayouts: dict[tuple[Any, ...], float] = {}
        self._data_links: dict[tuple[int, LayerStrategy, bool], Link] = {}
        self._stage_memory: dict[tuple[Any, ...], StageMemory] = {}
        self._named_units: dict[tuple[Any, ...], StageUnit] = {}
        self._unit_stages: dict[tuple[Any, ...], tuple[dict[str, int], list[list[str]]]] = {}
        self._stage_time: dict[tuple[Any, ...], StageTime] = {}
        self.work = {"plan_memory_requests": 0, "plan_memory_evaluations": 0, "plan_time_requests": 0,
                     "plan_time_evaluations": 0}

    @property
    def cluster(self) -> Cluster:
        if self._cluster is None:
            raise StrategyError("a cluster is needed to price time")
        return self._cluster

    @property
    def collective_slowdown(self) -> float:
        """The share of the compute lost while data-parallel traffic runs under it
        (:func:`~parplan.solver.cost.kernels.collective_sm_share`)."""
        return collective_sm_share(self.cluster.gpu)

    # ---------------------------------------------------------------- structure
    def units(self, plan: LayerPlan) -> tuple[dict[str, int], list[list[str]]]:
        """Every unit's pipeline stage (device), and each stage's units in forward order (kept per
        pipeline degree, chunks, partition and batch; not to be changed by the caller)."""
        batch = plan.local_batch(next(iter(plan.layers.values())))
        key = (plan.pp, self.chunks(plan), plan.partition, batch)
        kept = self._unit_stages.get(key) if self.cache else None
        if kept is None:
            kept = self._units(plan, batch)
            if self.cache:
                self._unit_stages[key] = kept
        return kept

    def _units(self, plan: LayerPlan, batch: int) -> tuple[dict[str, int], list[list[str]]]:
        gc = self.costs_for(batch)
        virtual = self.virtual_stages(plan)
        unit_stage = {u: vs % plan.pp for u, vs in virtual.items()}
        by_stage: list[list[str]] = [[] for _ in range(plan.pp)]
        for u in gc.units:
            by_stage[unit_stage.get(u, 0)].append(u)
        return unit_stage, by_stage

    def chunks(self, plan: LayerPlan) -> int:
        """Model chunks per device: ``v`` under the interleaved schedule, else 1."""
        return plan.virtual_stages if plan.schedule is Schedule.INTERLEAVED and plan.virtual_stages > 1 else 1

    def virtual_stages(self, plan: LayerPlan) -> dict[str, int]:
        """Every unit's virtual stage: blocks cut into ``pp·v`` chunks (``partition``: blocks per
        chunk, even when not given), chunk ``k`` of device ``i`` being virtual stage ``i + k·pp``."""
        gc = self.costs_for(plan.local_batch(next(iter(plan.layers.values()))))
        n = plan.pp * self.chunks(plan)
        part = plan.partition if plan.partition is not None and len(plan.partition) == n else None
        if n > plan.pp and plan.partition is not None and part is None:
            raise StrategyError(f"an interleaved partition gives blocks per virtual stage: {n} entries, got "
                                f"{len(plan.partition)}")
        return stage_of_units(gc.graph, n, part)

    def strategies(self, plan: LayerPlan, by_stage: list[list[str]]) -> dict[str, LayerStrategy]:
        """Every unit's strategy: blocks their own, the others their neighbour block's."""
        out: dict[str, LayerStrategy] = {}
        for units in by_stage:
            blocks = [u for u in units if u in plan.layers]
            if not blocks:
                raise StrategyError("every pipeline stage needs at least one block")
            current = plan.layers[blocks[0]]
            for u in units:
                current = plan.layers.get(u, current)
                out[u] = current
        return out

    def mesh(self, plan: LayerPlan, s: LayerStrategy) -> DeviceMesh:
        key = (plan.pp, s)
        if key not in self._meshes:
            if s.dp % s.ep:
                raise StrategyError(f"ep {s.ep} must divide dp {s.dp}")
            # context-parallel ranks sit inside the data axes, next to the tensor axis (Megatron's
            # order tp-cp-ep-dp-pp: TP within a node first, then CP)
            data = [("edp", s.dp // s.ep), ("ep", s.ep)] + ([("cp", s.cp)] if s.cp > 1 else [])
            inner = [*data, ("tp", s.tp)] if s.tp_inner else [("tp", s.tp), *data]
            self._meshes[key] = DeviceMesh.of(self.cluster, [("pp", plan.pp), *inner])
        return self._meshes[key]

    def env(self, plan: LayerPlan, s: LayerStrategy, prec: Precision) -> TimeEnv:
        key = (plan.pp, s, prec.name)
        if key not in self._envs:
            mesh = self.mesh(plan, s)
            link = mesh.link("tp", self.cluster) if s.tp > 1 else None
            # every ring step waits for its slowest hop: the network once the ring leaves a node
            ring = mesh.hop_link("cp", self.cluster) if s.cp > 1 else None
            group = mesh.link("cp", self.cluster) if s.cp > 1 else None
            ep = mesh.link("ep", self.cluster) if s.ep > 1 else None
            self._envs[key] = TimeEnv(self.cluster.gpu, self.calibration, prec, link, ring, group, ep)
        return self._envs[key]

    def data_link(self, plan: LayerPlan, s: LayerStrategy, expert: bool = False) -> Link:
        key = (plan.pp, s, expert)
        link = self._data_links.get(key)
        if link is None:
            mesh = self.mesh(plan, s)
            axes = (["edp"] if expert else ["edp", "ep"]) + (["cp"] if s.cp > 1 else [])
            link = self._data_links[key] = mesh.group_link([a for a in axes if dict(mesh.axes)[a] > 1], self.cluster)
        return link

    def check(self, plan: LayerPlan) -> None:
        """Every block's degrees use exactly the stage's devices (the cluster's, when known)."""
        sizes = {s.tp * s.cp * s.dp for s in plan.layers.values()}
        if len(sizes) > 1:
            raise StrategyError("every block's tp x cp x dp must be the same (the devices of a stage)")
        if len({s.cp for s in plan.layers.values()}) > 1:
            raise StrategyError("every block needs the same context-parallel degree")
        for tp, cp, comm in {(s.tp, s.cp, s.cp_comm) for s in plan.layers.values() if s.cp > 1}:
            if (tp, cp, comm) not in self._cp_checked:
                graph = self.costs_for(plan.local_batch(next(iter(plan.layers.values())))).graph
                check_context_parallel(graph, cp, comm, tp)
                self._cp_checked.add((tp, cp, comm))
        n = plan.pp * sizes.pop()
        if self._cluster is not None and n != self._cluster.num_devices:
            with_cp = " x cp" if any(s.cp > 1 for s in plan.layers.values()) else ""
            raise StrategyError(f"tp{with_cp} x dp x pp = {n} does not match the {self._cluster.num_devices} devices")
        overlaps = (plan.tp_comm_overlap or plan.overlap_param_gather or not plan.overlap_grad_reduce
                    or plan.pp_scatter_gather)
        for s in set(plan.layers.values()) if overlaps else ():
            check_overlaps(plan.runtime, plan.tp_comm_overlap, plan.overlap_param_gather, s.sp or s.tp == 1,
                           s.zero if s.data_ranks > 1 else 1, plan.overlap_grad_reduce, plan.pp_scatter_gather)
        for u, s in plan.layers.items():
            if s.sp and s.tp == 1:
                raise StrategyError(f"{u}: sequence parallelism needs tp > 1")
            if s.ep > 1:
                experts = self._experts.get(u)
                if experts is None:
                    nodes = self.costs_for(plan.local_batch(s)).nodes.get(u, ())
                    experts = self._experts[u] = max((size for n in nodes for d, size in n.dims if d == "expert"),
                                                     default=0)
                if experts % s.ep:
                    raise StrategyError(f"{u}: expert parallelism ep={s.ep} does not divide its {experts} experts")

    # ---------------------------------------------------------------- costs of one unit
    def unit_cost(self, plan: LayerPlan, u: str, s: LayerStrategy, prec: Precision, timed: bool) -> UnitCost:
        gc = self.costs_for(plan.local_batch(s))
        env = self.env(plan, s, prec) if timed else None
        return gc.unit_cost(u, s.unit(plan.flash_attention, plan.runtime), prec, env)

    def sync_seconds(self, plan: LayerPlan, s: LayerStrategy, params: Iterable[OwnedParam],
                     prec: Precision, unit_numel: float) -> DataParallelTraffic:
        """The data-parallel traffic (:class:`DataParallelTraffic`) of one operator's parameters,
        synchronised together: over their data-parallel group (dense: ``dp x cp`` ranks,
        experts: ``dp x cp / ep``), in the collectives the runtime groups them into
        (:func:`data_parallel_collectives`; ``unit_numel``: the elements of the parameters the unit
        reads, whose one collective the operator shares), and those TP replicates while the
        operator's work is split all-reduced over TP."""
        tensors: dict[bool, list[float]] = {False: [], True: []}  # each parameter's local elements
        numel = {False: 0.0, True: 0.0}
        tp_partial = 0.0
        for p in params:
            tensors[p.group.expert].append(p.elems)
            numel[p.group.expert] += p.numel
            tp_partial += p.elems if p.tp_partial else 0.0
        reduce = weight_gather = gathers = 0.0
        for expert, local in tensors.items():
            n, e = _group_ranks(s, expert), sum(local)
            if n > 1 and e:
                count = data_parallel_collectives(plan.runtime, s.tp, n, s.zero, local, prec.grad_bytes,
                                                  numel[expert] / unit_numel if unit_numel else 0.0)
                link = self.data_link(plan, s, expert)
                weights = e * prec.weight_transfer_bytes
                traffic = data_parallel_seconds(n, e * prec.grad_bytes, weights, s.zero, link, count)
                reduce += traffic.reduce
                weight_gather += traffic.weight_gather
                gathers += traffic.gathers
        if tp_partial:
            tp_link = self.mesh(plan, s).link("tp", self.cluster)
            reduce += all_reduce_seconds(s.tp, tp_partial * prec.grad_bytes, tp_link)
        return DataParallelTraffic(reduce, weight_gather, gathers)

    def copy_seconds(self, plan: LayerPlan, s: LayerStrategy, params: Iterable[OwnedParam], prec: Precision,
                     reductions: int) -> float:
        """Seconds per step of the copies the runtime's sharded data parallelism makes around the
        collectives of these parameters (:func:`sharded_copy_seconds`), ``reductions`` times a step."""
        elems = {False: 0.0, True: 0.0}
        for p in params:
            elems[p.group.expert] += p.elems
        return sum(sharded_copy_seconds(plan.runtime, s.tp, _group_ranks(s, expert), s.zero, e, prec,
                                        self.cluster.gpu, self.calibration, plan.num_microbatches, reductions)
                   for expert, e in elems.items())

    def once_per_step(self, plan: LayerPlan, c: UnitCost, s: LayerStrategy, prec: Precision,
                      synced: set[str], own: bool = True, shared: bool = True) -> tuple[float, float]:
        """(gradient traffic, of it what overlap does not hide, with the runtime's copies around the
        collectives, :meth:`copy_seconds`) of the parameters ``c``'s operators own, each operator's
        overlapped with its own backward; a shared parameter only the first time (``synced`` collects
        them). ``own`` / ``shared``: which parameters to count."""
        total = exposed = 0.0
        m = plan.num_microbatches
        # gradient syncs per step
        every = m if plan.sync_every_microbatch or plan.runtime.reduces_every_microbatch(plan.pp > 1) else 1
        slowdown = self.collective_slowdown
        for op in c.owners:
            params = [p for p in op.params if (shared and p.shared and p.id not in synced) or (own and not p.shared)]
            synced.update(p.id for p in params if p.shared)
            t = self.sync_seconds(plan, s, params, prec, c.param_numel)
            total += every * t.sync + m * t.gathers
            exposed += self.copy_seconds(plan, s, params, prec, every)  # on the compute's HBM: never hidden
            if not plan.overlap_grad_reduce:
                # Megatron-LM without --overlap-grad-reduce: the reduction (with the distributed
                # optimizer, its weight all-gather too) runs after the backward, none of it hidden
                exposed += every * (t.sync + exposed_seconds(0.0, t.gathers, op.forward_seconds,
                                                             op.backward_seconds, m // every, slowdown=slowdown))
            else:
                exposed += every * (exposed_seconds(t.reduce, t.gathers, op.forward_seconds, op.backward_seconds,
                                                    m // every, slowdown=slowdown)
                                    + weight_gather_exposed_seconds(t.weight_gather, op.forward_seconds,
                                                                    self.gathers_under_forward(plan, s),
                                                                    slowdown=slowdown))
        return total, exposed

    def gathers_under_forward(self, plan: LayerPlan, s: LayerStrategy) -> bool:
        """Whether ZeRO 1-2's gather of the updated weights runs under the next forward: with
        Megatron-LM's ``--overlap-param-gather``, and where the runtime gathers each unit's weights
        before its forward (FSDP without resharding); else after the optimizer step."""
        return plan.overlap_param_gather or plan.runtime.data_parallel(s.tp, s.data_ranks, s.zero).gathers

    def optimizer_seconds(self, states: MemoryBreakdown) -> float:
        return optimizer_step_seconds(states, self.cluster.gpu, self.calibration)

    # ---------------------------------------------------------------- whole plans
    def memory(self, plan: LayerPlan) -> PlanMemory:
        return self._kept(self._plan_memory, "plan_memory", plan, self._memory)

    def _kept(self, store: dict[tuple[Any, ...], _Priced], kind: str, plan: LayerPlan,
              price: Callable[[LayerPlan], _Priced]) -> _Priced:
        """``price(plan)``, kept in ``store`` per :func:`plan_key`; counts the requests and the
        evaluations computed (``work["<kind>_requests"]``, ``work["<kind>_evaluations"]``)."""
        self.work[f"{kind}_requests"] += 1
        key = plan_key(plan)
        kept = store.get(key) if self.cache else None
        if kept is None:
            self.work[f"{kind}_evaluations"] += 1
            kept = price(plan)
            if self.cache:
                store[key] = kept
        return kept

    def _stage_unit_memory(self, plan: LayerPlan, u: str, s: LayerStrategy, prec: Precision, seen: set[str],
                           tied_ids: set[str]) -> tuple[StageUnit, tuple[float, ...], bool, float, float, float]:
        """One unit's part of its stage's memory: its walk entry, model states (bytes then
        redundant, by category), whether DDP rebuilds its buckets, activation bytes, redundant
        activation bytes, largest parameter. Kept per alike unit for units using no shared
        parameter (``seen`` and ``tied_ids`` do not matter for them)."""
        gc = self.costs_for(plan.local_batch(s))
        is_block = u in plan.layers
        key: tuple[Any, ...] | None = None
        if self.cache and u not in gc.param_sharing:
            key = (plan.global_batch, plan.num_microbatches, plan.flash_attention, plan.runtime, prec.name,
                   gc.representative[u], s, is_block)
            hit = self._unit_memory.get(key)
            if hit is not None:
                if hit[0].name == u:
                    return hit
                named = self._named_units.get((key, u))
                if named is None:
                    named = self._named_units[(key, u)] = dataclasses.replace(hit[0], name=u)
                return (named, *hit[1:])
        c = self.unit_cost(plan, u, s, prec, timed=False)
        dp = plan.runtime.data_parallel(s.tp, s.data_ranks, s.zero)
        walk = stage_unit(u, gc, s.unit(plan.flash_attention, plan.runtime), c, is_block, dp, prec, seen, tied_ids)
        st = model_states(c.params, s, plan.runtime.states_precision(prec), dp.shards_parameters)
        floats = (*st.bytes.as_floats().values(), *st.redundant.as_floats().values())
        out = (walk, floats, dp.rebuilds_buckets, c.act_bytes, c.act_redundant_bytes, c.largest_param_elems)
        if key is not None:
            self._unit_memory[key] = out
        return out

    def _memory(self, plan: LayerPlan) -> PlanMemory:
        self.check(plan)
        prec = get_precision(plan.precision)
        unit_stage, by_stage = self.units(plan)
        strat = self.strategies(plan, by_stage)
        stages = []
        v = self.chunks(plan)
        virtual = self.virtual_stages(plan) if v > 1 else {}
        for stage, units in enumerate(by_stage):
            if v > 1:
                stages.append(self._interleaved_stage(plan, stage, units, virtual, strat, prec))
                continue
            key: tuple[Any, ...] | None = None
            if self.cache:
                following = (tuple(by_stage[stage + 1]) if plan.runtime.holds_stage_outputs
                             and stage + 1 < len(by_stage) else None)
                key = (*self._stage_key(plan, stage, tuple(units), units, strat), following)
                hit = self._stage_memory.get(key)
                if hit is not None:
                    stages.append(hit)
                    continue
            result = self._one_stage_memory(plan, stage, units, by_stage, unit_stage, strat, prec)
            if key is not None:
                self._stage_memory[key] = result
            stages.append(result)
        return PlanMemory(tuple(stages))

    @staticmethod
    def _stage_key(plan: LayerPlan, where: Any, names: tuple[str, ...], units: list[str],
                   strat: Mapping[str, LayerStrategy]) -> tuple[Any, ...]:
        """What a stage's price depends on: the plan's own fields, ``where`` the stage sits, its units
        (as ``names``) and their strategies."""
        return (plan.pp, plan.num_microbatches, plan.global_batch, plan.schedule, plan.virtual_stages,
                plan.flash_attention, plan.precision, plan.runtime, plan.sync_every_microbatch,
                plan.tp_comm_overlap, plan.overlap_param_gather, plan.overlap_grad_reduce, plan.pp_scatter_gather,
                where, names,
                tuple([(strat[u], u in plan.layers) for u in units]))

    def _stage_time_key(self, plan: LayerPlan, stage: int, units: list[str],
                        strat: Mapping[str, LayerStrategy]) -> tuple[Any, ...]:
        """:meth:`_stage_key` for a stage's time: where it sits is only whether it is the first or
        the last stage, and its units are named by their representatives (alike units cost the
        same). A stage between others receives the same tensors from its neighbours wherever it
        sits, so the middle stages of a pipeline of alike blocks are priced once."""
        rep = self.costs_for(plan.local_batch(strat[units[0]])).representative
        return self._stage_key(plan, (stage == 0, stage == plan.pp - 1), tuple([rep[u] for u in units]), units,
                               strat)

    def _one_stage_memory(self, plan: LayerPlan, stage: int, units: list[str], by_stage: list[list[str]],
                          unit_stage: Mapping[str, int], strat: Mapping[str, LayerStrategy],
                          prec: Precision) -> StageMemory:
        """One stage's memory (1F1B or GPipe): see :meth:`memory`."""
        states = Memory(MemoryBreakdown(), MemoryBreakdown())
        act = act_red = largest = 0.0
        walk: list[StageUnit] = []
        seen: set[str] = set()
        tied_ids = self.costs_for(plan.local_batch(strat[units[0]])).tied_ids(units)
        # DDP's second copy of the gradients, once (see cost.runtime; not measured under
        # torch.distributed.pipelining, which drives DDP's synchronisation itself)
        rebuilt_buckets = 0.0
        sums = [0.0] * 10  # model states by category: bytes, then redundant (summed in unit order)
        unit_grads: list[float] = []
        for u in units:
            entry, floats, rebuilds, unit_act, unit_red, unit_largest = self._stage_unit_memory(
                plan, u, strat[u], prec, seen, tied_ids)
            walk.append(entry)
            unit_grads.append(floats[1])
            for k in range(10):
                sums[k] += floats[k]
            rebuilt_buckets += floats[1] if rebuilds and plan.pp == 1 else 0.0
            act += unit_act
            act_red += unit_red
            largest = max(largest, unit_largest)
        states = Memory(MemoryBreakdown(*sums[:5]), MemoryBreakdown(*sums[5:]))
        first = strat[units[0]]
        gc = self.costs_for(plan.local_batch(first))
        us = first.unit(plan.flash_attention, plan.runtime)
        first_dp = plan.runtime.data_parallel(first.tp, first.data_ranks, first.zero)
        shared_states = model_states(gc.shared_param_elems(units, us), first, plan.runtime.states_precision(prec),
                                     first_dp.shards_parameters)
        states = states + shared_states
        rebuilt_buckets += shared_states.bytes.gradients if first_dp.rebuilds_buckets and plan.pp == 1 else 0.0
        shared_act, shared_red = gc.shared_item_bytes(units, us, prec.activation_bytes)
        receive = pinned = sent = 0.0  # pipelining's receive buffers; a sent output its send keeps
        if plan.runtime.holds_stage_outputs and plan.pp > 1:
            received, saved_there, sent = self._pipeline_boundaries(plan, stage, by_stage, unit_stage, strat,
                                                                    prec)
            # the output sent to the next stage, kept until this micro-batch's backward; a
            # received input saved for backward lives in its receive buffer
            shared_act += sent - saved_there
            receive = plan.num_microbatches * (received + sent)  # activations in, gradients in
        act += shared_act
        act_red += shared_red
        flight = in_flight_microbatches(stage, plan.pp, plan.num_microbatches, plan.schedule,
                                        plan.virtual_stages)
        if plan.runtime.holds_stage_outputs and plan.schedule is Schedule.ONE_F_ONE_B and flight >= 2:
            # PyTorch's 1F1B keeps the handle of the first warm-up send until the steady phase
            # ends, and the handle keeps that micro-batch's output alive after its backward
            pinned = sent
        # gradients made in backward (torchtitan sets them to None between steps); with pipelining
        # other micro-batches' backwards run before, so they count as resident there
        grads_later = not plan.runtime.keeps_gradients and plan.pp == 1
        walked = stage_peak(walk, prec, shared_act, gc.tied_within(units, us),
                            gc.tied_gradient_workspace(units, us),
                            accumulating=(plan.num_microbatches > 1 and plan.runtime.accumulates_unsharded(plan.pp > 1)
                                          and not plan.sync_every_microbatch),
                            pipelined=plan.pp > 1 and plan.runtime.holds_stage_outputs,
                            created_grads=unit_grads if grads_later else None,
                            shared_grads=shared_states.bytes.gradients if grads_later else 0.0,
                            later_microbatches=plan.num_microbatches > 1)
        optimizer = optimizer_temporary_bytes(largest, prec)
        resident = states.bytes.total
        walk_base = resident - states.bytes.gradients if grads_later else resident
        peak = max(walk_base + act * (flight - 1) + walked.above_resident, resident + optimizer,
                   resident + rebuilt_buckets)
        fixed = receive + plan.runtime.held_through_step_bytes  # held through the whole step
        held = states.bytes.replace(activations=act * flight + pinned,
                                    temporary=max(walked.temporary, optimizer, rebuilt_buckets) + fixed)
        red = states.redundant.replace(activations=act_red * flight)
        return StageMemory(stage, tuple(units), Memory(held, red), act, flight, peak + fixed + pinned)

    def _interleaved_stage(self, plan: LayerPlan, stage: int, units: list[str], virtual: Mapping[str, int],
                           strat: Mapping[str, LayerStrategy], prec: Precision) -> StageMemory:
        """A device's memory under interleaved 1F1B: its ``v`` chunks hold different activations and
        different numbers of micro-batches in flight, so the peak comes from the rank's own order of
        forwards and backwards (:func:`~.pipeline.interleaved_rank_order`): at each backward the
        in-flight micro-batches of every chunk and that chunk's walk. PyTorch's schedule also keeps
        a receive buffer per virtual stage boundary and micro-batch, and every send's handle, with
        the output or input gradient it sent, until the step ends."""
        pp, v, m = plan.pp, self.chunks(plan), plan.num_microbatches
        by_vstage: list[list[str]] = [[] for _ in range(pp * v)]
        for u in units:
            by_vstage[virtual[u]].append(u)
        all_by_vstage: list[list[str]] = [[] for _ in range(pp * v)]
        for u, vs in virtual.items():
            all_by_vstage[vs].append(u)
        gc0 = self.costs_for(plan.local_batch(strat[units[0]]))
        order = {u: k for k, u in enumerate(gc0.units)}
        for lst in all_by_vstage:
            lst.sort(key=order.__getitem__)
        states = Memory(MemoryBreakdown(), MemoryBreakdown())
        largest = 0.0
        acts, reds, walks, sent, grads_sent, receive = [], [], [], [], [], 0.0
        torch = plan.runtime.holds_stage_outputs
        for k in range(v):
            vs = stage + k * pp
            chunk = by_vstage[vs]
            first = strat[chunk[0]]
            gc = self.costs_for(plan.local_batch(first))
            us = first.unit(plan.flash_attention, plan.runtime)
            walk: list[StageUnit] = []
            seen: set[str] = set()
            tied_ids = gc.tied_ids(chunk)
            act = red = 0.0
            for u in chunk:
                s = strat[u]
                c = self.unit_cost(plan, u, s, prec, timed=False)
                dp = plan.runtime.data_parallel(s.tp, s.data_ranks, s.zero)
                walk.append(stage_unit(u, self.costs_for(plan.local_batch(s)), s.unit(plan.flash_attention,
                                       plan.runtime), c, u in plan.layers, dp, prec, seen, tied_ids))
                states = states + model_states(c.params, s, plan.runtime.states_precision(prec), dp.shards_parameters)
                act += c.act_bytes
                red += c.act_redundant_bytes
                largest = max(largest, c.largest_param_elems)
            shared_act, shared_red = gc.shared_item_bytes(chunk, us, prec.activation_bytes)
            out = received = 0.0
            if torch:
                received, saved_there, out = self._pipeline_boundaries(
                    plan, vs, all_by_vstage, virtual, strat, prec, pp * v)
                shared_act += out - saved_there
                receive += m * (received + out)  # activations in, gradients in
            acts.append(act + shared_act)
            reds.append(red + shared_red)
            walks.append(stage_peak(walk, prec, shared_act, gc.tied_within(chunk, us),
                                    gc.tied_gradient_workspace(chunk, us)).above_resident)
            sent.append(out)
            grads_sent.append(received)  # the input gradient sent back is the size of the input received
        live, forwards, backwards = [0] * v, [0] * v, [0] * v
        above = act_peak = 0.0
        for kind, k in interleaved_rank_order(pp, v, m, stage):
            if kind == "F":
                live[k] += 1
                forwards[k] += 1
            held = sum(n * a for n, a in zip(live, acts, strict=True))
            # PyTorch keeps every send's handle, and what it sent, until the step ends
            handles = sum((f - n) * o + b * g for f, n, b, o, g in zip(forwards, live, backwards, sent, grads_sent,
                                                                      strict=True)) if torch else 0.0
            act_peak = max(act_peak, held + handles)
            above = max(above, held - acts[k] + walks[k] + handles)
            if kind == "B":
                live[k] -= 1
                backwards[k] += 1
        first = strat[units[0]]
        gc = self.costs_for(plan.local_batch(first))
        us = first.unit(plan.flash_attention, plan.runtime)
        first_dp = plan.runtime.data_parallel(first.tp, first.data_ranks, first.zero)
        states = states + model_states(gc.shared_param_elems(units, us), first, plan.runtime.states_precision(prec),
                                       first_dp.shards_parameters)
        optimizer = optimizer_temporary_bytes(largest, prec)
        resident = states.bytes.total
        per_micro = sum(acts)
        flight = act_peak / per_micro if per_micro else 0.0
        fixed = receive + plan.runtime.held_through_step_bytes  # held through the whole step
        temp = max(above - act_peak, optimizer, 0.0) + fixed
        held_bytes = states.bytes.replace(activations=act_peak, temporary=temp)
        red_bytes = states.redundant.replace(activations=sum(reds) * flight)
        return StageMemory(stage, tuple(units), Memory(held_bytes, red_bytes), per_micro, flight,
                           max(resident + above, resident + optimizer) + fixed)

    def _pipeline_boundaries(self, plan: LayerPlan, stage: int, by_stage: list[list[str]],
                             unit_stage: Mapping[str, int], strat: Mapping[str, LayerStrategy],
                             prec: Precision, stages: int | None = None) -> tuple[float, float, float]:
        """Per-device bytes of one micro-batch's (activation received, of it what the stage saves
        for backward, activation sent) at a stage's pipeline boundaries (``stages``: how many,
        virtual stages under the interleaved schedule)."""
        units = by_stage[stage]
        first, last = strat[units[0]], strat[units[-1]]
        received = saved = sent = 0.0

        def stage_of(u: str) -> int:
            return unit_stage.get(u, 0)

        if stage > 0:
            gc = self.costs_for(plan.local_batch(first))
            us = first.unit(plan.flash_attention, plan.runtime)
            received = sum(gc.boundary_bytes(units, stage_of, stage, us, prec.activation_bytes))
            ids = {i for u in units for i in gc.external_inputs[u] if stage_of(gc.unit_of[i]) != stage}
            items = gc.saved(us.recompute, us.flash_attention, prec.activation_bytes, us.runtime)[0]
            saved = gc.item_bytes((it for u in units for it in items[u] if it.key in ids), us)[0]
        if stage < (stages or plan.pp) - 1:
            sent = sum(self.costs_for(plan.local_batch(last)).boundary_bytes(
                by_stage[stage + 1], stage_of, stage + 1, last.unit(plan.flash_attention, plan.runtime),
                prec.activation_bytes))
        return received, saved, sent

    def time(self, plan: LayerPlan) -> PlanTime:
        return self._kept(self._plan_time, "plan_time", plan, self._time)

    def _time(self, plan: LayerPlan) -> PlanTime:
        self.check(plan)
        prec = get_precision(plan.precision)
        unit_stage, by_stage = self.units(plan)
        strat = self.strategies(plan, by_stage)
        stages = []
        for stage, units in enumerate(by_stage):
            key = self._stage_time_key(plan, stage, units, strat) if self.cache else None
            hit = self._stage_time.get(key) if key is not None else None
            if hit is None:
                hit = self._one_stage_time(plan, stage, units, unit_stage, strat, prec)
                if key is not None:
                    self._stage_time[key] = hit
            elif hit.stage != stage:
                hit = dataclasses.replace(hit, stage=stage)
            stages.append(hit)
        v = plan.virtual_stages if plan.schedule is Schedule.INTERLEAVED else 1
        step = pipeline_seconds([s.microbatch_seconds for s in stages], [s.step_seconds for s in stages],
                                plan.num_microbatches, v)
        gc = self.costs_for(plan.local_batch(next(iter(plan.layers.values()))))
        seq = int(gc.graph.meta.get("seq_len", 0) or 0)
        return PlanTime(tuple(stages), step, plan.global_batch * seq, plan.num_microbatches)

    def _one_stage_time(self, plan: LayerPlan, stage: int, units: list[str], unit_stage: Mapping[str, int],
                        strat: Mapping[str, LayerStrategy], prec: Precision) -> StageTime:
        """One stage's seconds: see :meth:`time`."""
        fwd = bwd = rec = tp = relayout = cp_exposed = ep = 0.0
        sync_total = exposed = opt = 0.0
        previous: LayerStrategy | None = None
        synced: set[str] = set()  # shared parameters synchronised once per stage
        for u in units:
            s = strat[u]
            f, b, r, t, traffic, hidden_not, o, cp, e = self._unit_time_parts(plan, u, s, prec, synced)
            fwd += f
            bwd += b
            rec += r
            tp += t
            cp_exposed += cp
            ep += e
            sync_total += traffic
            exposed += hidden_not
            opt += o
            if previous is not None and previous is not s and previous.layout_key != s.layout_key:
                rkey = (plan.pp, plan.num_microbatches, plan.global_batch, prec.name, u, s)
                seconds = self._relayouts.get(rkey) if self.cache else None
                if seconds is None:
                    seconds = self._relayouts[rkey] = self.relayout_seconds(plan, u, s, prec)
                relayout += seconds
            previous = s
        first = strat[units[0]]
        gc = self.costs_for(plan.local_batch(first))
        shared = gc.shared_param_elems(units, first.unit(plan.flash_attention, plan.runtime))
        if shared:
            opt += self.optimizer_seconds(model_states(shared, first, plan.runtime.states_precision(prec)).bytes)
        p2p = 0.0
        if plan.pp > 1:
            link = self.mesh(plan, first).hop_link("pp", self.cluster)
            boundary = gc.boundary_bytes(units, lambda x: unit_stage.get(x, 0), stage,
                                         first.unit(plan.flash_attention, plan.runtime), prec.activation_bytes)
            p2p = sum(2 * self._handoff_seconds(plan, first, b, link) for b in boundary)
        return StageTime(stage, fwd, bwd, rec, tp, p2p, sync_total, exposed, opt, relayout, cp_exposed, ep)

    def _handoff_seconds(self, plan: LayerPlan, s: LayerStrategy, nbytes: float, link: Link) -> float:
        """Seconds of one pipeline hand-off of ``nbytes`` per device over ``link``. Under
        ``plan.pp_scatter_gather`` a tensor every TP rank holds whole (no sequence parallelism)
        travels as ``tp`` shares, each rank sending its own, and is all-gathered over TP after."""
        if not (plan.pp_scatter_gather and s.tp > 1 and not s.sp):
            return p2p_seconds(nbytes, link)
        tp_link = self.mesh(plan, s).group_link(("tp",), self.cluster)
        return p2p_seconds(nbytes / s.tp, link) + all_gather_seconds(s.tp, nbytes, tp_link)

    def _unit_time_parts(self, plan: LayerPlan, u: str, s: LayerStrategy, prec: Precision,
                         synced: set[str]) -> tuple[float, float, float, float, float, float, float, float, float]:
        """One unit's (forward, backward, recompute, TP collectives) seconds of one micro-batch,
        (gradient traffic, its exposed part, optimizer) seconds per step, and the exposed part of its
        context-parallel exchange and its expert-parallel all-to-alls of one micro-batch; kept per
        alike unit for units using no shared parameter (``synced`` does not matter for them)."""
        gc = self.costs_for(plan.local_batch(s))
        key: tuple[Any, ...] | None = None
        if self.cache and u not in gc.param_sharing:
            key = (plan.pp, plan.num_microbatches, plan.global_batch, plan.flash_attention, plan.runtime, prec.name,
                   plan.sync_every_microbatch, plan.tp_comm_overlap, plan.overlap_param_gather,
                   plan.overlap_grad_reduce, gc.representative[u], s)
            hit = self._unit_time.get(key)
            if hit is not None:
                return hit  # type: ignore[return-value]
        c = self.unit_cost(plan, u, s, prec, timed=True)
        traffic, hidden_not = self.once_per_step(plan, c, s, prec, synced)
        tp = c.tp_comm_seconds
        if plan.tp_comm_overlap:
            # Transformer Engine runs each all-gather / reduce-scatter in chunks under the GEMM that
            # consumes or produces it: hidden up to the unit's GEMM time (forward, backward, recomputed)
            tp = max(0.0, tp - c.matmul_seconds)
        out = (c.forward_seconds, c.backward_seconds, c.recompute_seconds, tp, traffic, hidden_not,
               self.optimizer_seconds(model_states(c.params, s, plan.runtime.states_precision(prec)).bytes),
               c.cp_comm_seconds, c.ep_comm_seconds)
        if key is not None:
            self._unit_time[key] = out
        return out

    def relayout_seconds(self, plan: LayerPlan, u: str, s: LayerStrategy, prec: Precision) -> float:
        """Re-distributing the activation entering block ``u`` when its layout differs from the
        previous block's: an all-to-all over the stage's devices, forward and backward."""
        gc = self.costs_for(plan.local_batch(s))
        n = s.tp * s.cp * s.dp
        mesh = self.mesh(plan, s)
        link = mesh.group_link([a for a, size in mesh.axes if a != "pp" and size > 1], self.cluster)
        full = sum(gc.graph.node(i).numel for i in gc.external_inputs[u]) * prec.activation_bytes * s.dp
        return 2 * all_to_all_seconds(n, full / n, link)

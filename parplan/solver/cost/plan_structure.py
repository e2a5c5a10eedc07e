"""Where a :class:`~.layer_plan.LayerPlan`'s units run, and the links between its devices.

Pure functions of their arguments: the pipeline stage and strategy of every unit, the checks a
plan must pass, the device mesh of a block's strategy and the links its collectives use.
:class:`Links` is what the pricing functions of :mod:`.stage_memory` and :mod:`.stage_time` ask
of the memo layer (:class:`~.plan_evaluator.PlanEvaluator` keeps these answers per key).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from parplan.solver.calibration import Calibration
from parplan.solver.cluster import Cluster, DeviceMesh, Link
from parplan.solver.cost.layer_plan import CostsFor, LayerPlan, LayerStrategy
from parplan.solver.cost.pipeline import device_of, stage_of_units
from parplan.solver.cost.precision import Precision, get_precision
from parplan.solver.cost.units import GraphCosts, TimeEnv, UnitCost
from parplan.solver.errors import StrategyError
from parplan.solver.strategy import (
    check_dp_shard,
    check_expert_tensor_parallel,
    check_overlaps,
    check_recompute,
    expert_data_span,
    hybrid_groups,
)


class Links(Protocol):
    """The model's graph costs, the cluster, and a block strategy's mesh and links."""

    costs_for: CostsFor
    calibration: Calibration

    @property
    def cluster(self) -> Cluster: ...

    def mesh(self, plan: LayerPlan, s: LayerStrategy) -> DeviceMesh: ...

    def env(self, plan: LayerPlan, s: LayerStrategy, prec: Precision) -> TimeEnv: ...

    def data_link(self, plan: LayerPlan, s: LayerStrategy, expert: bool = False) -> Link: ...

    def check(self, plan: LayerPlan) -> None: ...

    def units(self, plan: LayerPlan) -> tuple[dict[str, int], list[list[str]]]: ...


@dataclass(frozen=True)
class PlanLayout:
    """A plan's units by stage and their strategies, as one evaluation reads them."""

    prec: Precision
    unit_stage: dict[str, int]  # every unit's pipeline stage (device)
    by_stage: list[list[str]]  # each stage's units in forward order
    strat: dict[str, LayerStrategy]  # every unit's strategy


def plan_layout(p: Links, plan: LayerPlan) -> PlanLayout:
    """``plan`` checked (:meth:`Links.check`), its units placed on stages (:meth:`Links.units`)
    and given their strategies (:func:`strategies`)."""
    p.check(plan)
    prec = get_precision(plan.precision)
    unit_stage, by_stage = p.units(plan)
    return PlanLayout(prec, unit_stage, by_stage, strategies(plan, by_stage))


def unit_cost(p: Links, plan: LayerPlan, u: str, s: LayerStrategy, prec: Precision, timed: bool) -> UnitCost:
    """Unit ``u``'s costs under ``s`` (its time too when ``timed``), priced by its graph costs."""
    gc = p.costs_for(plan.local_batch(s))
    env = p.env(plan, s, prec) if timed else None
    return gc.unit_cost(u, s.unit(plan.flash_attention, plan.runtime), prec, env)


def stage_mesh(cluster: Cluster, pp: int, s: LayerStrategy) -> DeviceMesh:
    """The devices as a mesh of ``pp`` stages and ``s``'s axes inside each."""
    ep = expert_data_span(s.tp, s.ep, s.expert_tp)  # the expert group's span over the data axis
    if s.dp % ep:
        raise StrategyError(f"ep {s.ep} must divide dp {s.dp}")
    # context-parallel ranks sit inside the data axes, next to the tensor axis (Megatron's
    # order tp-cp-ep-dp-pp: TP within a node first, then CP)
    # hybrid sharding: the replicate axis outermost of the data axes, each shard group consecutive
    # ranks (torchtitan's mesh dp_replicate, dp_shard, cp, tp; Megatron-LM's intra-instance groups
    # are consecutive slices of its data-and-context-parallel group)
    shard, replicas = hybrid_groups(s.dp, s.dp_shard)
    rep = [("rep", replicas)] if s.dp_shard else []
    data = [*rep, ("edp", shard // ep), ("ep", ep)] + ([("cp", s.cp)] if s.cp > 1 else [])
    inner = [*data, ("tp", s.tp)] if s.tp_inner else [("tp", s.tp), *data]
    return DeviceMesh.of(cluster, [("pp", pp), *inner])


def time_env(cluster: Cluster, calibration: Calibration, mesh: DeviceMesh, s: LayerStrategy,
             prec: Precision) -> TimeEnv:
    """The hardware a unit under ``s`` on ``mesh`` is timed on."""
    link = mesh.link("tp", cluster) if s.tp > 1 else None
    # every ring step waits for its slowest hop: the network once the ring leaves a node
    ring = mesh.hop_link("cp", cluster) if s.cp > 1 else None
    group = mesh.link("cp", cluster) if s.cp > 1 else None
    # an expert group inside a TP group (an expert tensor-parallel degree below tp) runs on its links
    ep = mesh.group_link(["ep", "tp"] if s.expert_tp * s.ep < s.tp else ["ep"], cluster) if s.ep > 1 else None
    return TimeEnv(cluster.gpu, calibration, prec, link, ring, group, ep)


def data_group_link(cluster: Cluster, mesh: DeviceMesh, s: LayerStrategy, expert: bool) -> Link:
    """The link of the group a parameter's gradients are reduced over (an expert's without ``ep``);
    under hybrid sharding, of its shard group (the replicate axis's: :func:`replicate_link`)."""
    axes = (["edp"] if expert else ["edp", "ep"]) + (["cp"] if s.cp > 1 else [])
    return mesh.group_link([a for a in axes if dict(mesh.axes)[a] > 1], cluster)


def replicate_link(cluster: Cluster, mesh: DeviceMesh, s: LayerStrategy) -> Link:
    """The link of the replicate group of hybrid sharding (one rank of each shard group), which
    all-reduces each rank's gradient shard; the intra-node link without hybrid sharding."""
    return mesh.group_link(["rep"] if s.dp_shard else [], cluster)


def virtual_stages(gc: GraphCosts, plan: LayerPlan) -> dict[str, int]:
    """Every unit's virtual stage: blocks cut into ``pp·v`` chunks (``partition``: blocks per
    chunk, even when not given), chunk ``k`` of device ``i`` being virtual stage ``i + k·pp``, or
    in a V (``zbv``) ``i`` and ``2pp − 1 − i`` (:func:`~.pipeline.virtual_stage_of`)."""
    n = plan.pp * plan.chunks
    part = plan.partition if plan.partition is not None and len(plan.partition) == n else None
    if n > plan.pp and plan.partition is not None and part is None:
        raise StrategyError(f"an interleaved partition gives blocks per virtual stage: {n} entries, got "
                            f"{len(plan.partition)}")
    return stage_of_units(gc.graph, n, part)


def stage_units(gc: GraphCosts, plan: LayerPlan) -> tuple[dict[str, int], list[list[str]]]:
    """Every unit's pipeline stage (device), and each stage's units in forward order."""
    unit_stage = {u: device_of(vs, plan.pp, plan.schedule) for u, vs in virtual_stages(gc, plan).items()}
    by_stage: list[list[str]] = [[] for _ in range(plan.pp)]
    for u in gc.units:
        by_stage[unit_stage.get(u, 0)].append(u)
    return unit_stage, by_stage


def strategies(plan: LayerPlan, by_stage: list[list[str]]) -> dict[str, LayerStrategy]:
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


def unit_experts(gc: GraphCosts, u: str) -> int:
    """Experts per MoE layer in unit ``u`` (0: none)."""
    return max((size for n in gc.nodes.get(u, ()) for d, size in n.dims if d == "expert"), default=0)


def check_plan(plan: LayerPlan, devices: int | None, check_cp: Callable[[int, int, str], None],
               experts: Callable[[str, LayerStrategy], int]) -> None:
    """Every block's degrees use exactly the stage's devices (``devices``: the cluster's, when
    known), its overlaps are ones its runtime runs, and its expert degree divides its experts.
    ``check_cp(tp, cp, comm)`` raises unless the model allows that context parallelism;
    ``experts(u, s)``: :func:`unit_experts` of block ``u`` (under ``s``)."""
    sizes = {s.tp * s.cp * s.dp for s in plan.layers.values()}
    if len(sizes) > 1:
        raise StrategyError("every block's tp x cp x dp must be the same (the devices of a stage)")
    if len({s.cp for s in plan.layers.values()}) > 1:
        raise StrategyError("every block needs the same context-parallel degree")
    for tp, cp, comm in {(s.tp, s.cp, s.cp_comm) for s in plan.layers.values() if s.cp > 1}:
        check_cp(tp, cp, comm)
    n = plan.pp * sizes.pop()
    if devices is not None and n != devices:
        with_cp = " x cp" if any(s.cp > 1 for s in plan.layers.values()) else ""
        raise StrategyError(f"tp{with_cp} x dp x pp = {n} does not match the {devices} devices")
    overlaps = (plan.tp_comm_overlap or plan.overlap_param_gather or not plan.overlap_grad_reduce
                or plan.pp_scatter_gather)
    for s in set(plan.layers.values()) if overlaps else ():
        check_overlaps(plan.runtime, plan.tp_comm_overlap, plan.overlap_param_gather, s.sp or s.tp == 1,
                       s.zero if s.data_ranks > 1 else 1, plan.overlap_grad_reduce, plan.pp_scatter_gather)
    for s in {s for s in plan.layers.values() if s.dp_shard}:
        check_dp_shard(s.dp, s.dp_shard, s.zero, s.ep, plan.runtime)
    for s in {s for s in plan.layers.values() if s.etp}:
        check_expert_tensor_parallel(s.tp, s.dp, s.cp, s.ep, s.etp, s.sp, s.dp_shard, plan.runtime)
    for u, s in plan.layers.items():
        check_recompute(plan.runtime, s.recompute, plan.precision)
        if s.sp and s.tp == 1:
            raise StrategyError(f"{u}: sequence parallelism needs tp > 1")
        if s.ep > 1 and experts(u, s) % s.ep:
            raise StrategyError(f"{u}: expert parallelism ep={s.ep} does not divide its {experts(u, s)} experts")

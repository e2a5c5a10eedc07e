"""Memory and step time of a plan whose layers may each use a different strategy.

:class:`PlanEvaluator` is the memo layer over the pure pricing functions: what a plan is
(:mod:`.layer_plan`), where its units run (:mod:`.plan_structure`), a stage's memory
(:mod:`.stage_memory`) and time (:mod:`.stage_time`, :mod:`.gradient_sync`). It keeps each answer
per key (:mod:`.price_keys`, :class:`~.memo.Memo`); the pricing functions ask it for the parts
they are built from, so a part priced once serves every stage and plan with the same key.
Uniform (Megatron-style) strategies are evaluated through it too (:mod:`.plan_memory`,
:mod:`.plan_time`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from parplan.solver.calibration import DEFAULT_CALIBRATION, Calibration, apply
from parplan.solver.cluster import Cluster, DeviceMesh, Link
from parplan.solver.cost.collectives import DataParallelTraffic
from parplan.solver.cost.gradient_sync import copy_seconds, gathers_under_forward, once_per_step, sync_seconds
from parplan.solver.cost.kernels import collective_sm_share
from parplan.solver.cost.layer_plan import CostsFor, LayerPlan, LayerStrategy, plan_key
from parplan.solver.cost.memo import Memo
from parplan.solver.cost.memory import MemoryBreakdown
from parplan.solver.cost.plan_structure import (
    PlanLayout,
    check_plan,
    data_group_link,
    stage_mesh,
    stage_units,
    strategies,
    time_env,
    unit_cost,
    unit_experts,
    virtual_stages,
)
from parplan.solver.cost.precision import Precision
from parplan.solver.cost.price_keys import (
    relayout_key,
    stage_memory_key,
    stage_time_key,
    unit_memory_key,
    unit_time_key,
    units_key,
)
from parplan.solver.cost.stage_memory import (
    PlanMemory,
    StageMemory,
    UnitMemory,
    model_states,
    price_memory,
    stage_extra_temporary_bytes,
    stage_memory,
    unit_memory,
    unit_temporary_bytes,
)
from parplan.solver.cost.stage_time import (
    PlanTime,
    StageTime,
    UnitTimeParts,
    optimizer_seconds,
    pipeline_seconds,
    price_time,
    relayout_seconds,
    stage_time,
    unit_time_parts,
)
from parplan.solver.cost.units import GraphCosts, OwnedParam, TimeEnv, UnitCost
from parplan.solver.errors import StrategyError
from parplan.solver.strategy import check_context_parallel

__all__ = ["CostsFor", "LayerPlan", "LayerStrategy", "PlanEvaluator", "PlanMemory", "PlanTime", "StageMemory",
           "StageTime", "model_states", "pipeline_seconds", "plan_key", "shared_evaluator",
           "stage_extra_temporary_bytes", "unit_temporary_bytes"]


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


class PlanEvaluator:
    """Evaluates plans of one model on one cluster, keeping what it priced.

    Whole-plan answers are kept per plan (:func:`plan_key`), a stage's memory and time per stage
    (:mod:`.price_keys`), and what one unit contributes to its stage under one strategy per
    structurally alike unit (units that use no parameter another unit shares; the others are
    priced in place, in order): the stage sums add the same numbers in the same order, so every
    figure is the one an uncached walk gives. ``work`` counts the whole-plan evaluations asked for
    and those computed."""

    def __init__(self, costs_for: CostsFor, cluster: Cluster | None,
                 calibration: Calibration = DEFAULT_CALIBRATION, cache: bool = True) -> None:
        self.costs_for = costs_for
        self.cache = cache  # False: every plan and unit priced afresh (the oracle the tests compare with)
        self._cluster = apply(cluster, calibration) if cluster is not None else None
        self.calibration = calibration
        # the structure of the cluster and the model, kept whether or not prices are
        self._meshes: Memo[tuple[int, LayerStrategy], DeviceMesh] = Memo()
        self._envs: Memo[tuple[int, LayerStrategy, str], TimeEnv] = Memo()
        self._data_links: Memo[tuple[int, LayerStrategy, bool], Link] = Memo()
        self._experts: Memo[str, int] = Memo()  # unit -> experts per MoE layer in it (0: none)
        self._cp_checked: Memo[tuple[int, int, str], None] = Memo()  # (tp, cp, cp_comm) the model allows
        # prices, kept when ``cache``
        self._unit_stages: Memo[tuple[Any, ...], tuple[dict[str, int], list[list[str]]]] = Memo(cache)
        self._plan_memory: Memo[tuple[Any, ...], PlanMemory] = Memo(cache)
        self._plan_time: Memo[tuple[Any, ...], PlanTime] = Memo(cache)
        self._stage_memory: Memo[tuple[Any, ...], StageMemory] = Memo(cache)
        self._stage_time: Memo[tuple[Any, ...], StageTime] = Memo(cache)
        self._unit_memory: Memo[tuple[Any, ...], UnitMemory] = Memo(cache)
        self._named_units: Memo[tuple[Any, ...], UnitMemory] = Memo(cache)
        self._unit_time: Memo[tuple[Any, ...], UnitTimeParts] = Memo(cache)
        self._relayouts: Memo[tuple[Any, ...], float] = Memo(cache)

    @property
    def work(self) -> dict[str, int]:
        """Whole-plan evaluations asked for (``*_requests``) and computed (``*_evaluations``)."""
        return {"plan_memory_requests": self._plan_memory.requests,
                "plan_memory_evaluations": self._plan_memory.computed,
                "plan_time_requests": self._plan_time.requests, "plan_time_evaluations": self._plan_time.computed}

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
        batch = plan.local_batch(plan.first_strategy)
        return self._unit_stages(units_key(plan, batch), lambda: stage_units(self.costs_for(batch), plan))

    def chunks(self, plan: LayerPlan) -> int:
        """Model chunks per device: ``v`` under the interleaved schedule, else 1."""
        return plan.chunks

    def virtual_stages(self, plan: LayerPlan) -> dict[str, int]:
        """Every unit's virtual stage (:func:`~.plan_structure.virtual_stages`)."""
        return virtual_stages(self.costs_for(plan.local_batch(plan.first_strategy)), plan)

    def strategies(self, plan: LayerPlan, by_stage: list[list[str]]) -> dict[str, LayerStrategy]:
        """Every unit's strategy: blocks their own, the others their neighbour block's."""
        return strategies(plan, by_stage)

    def mesh(self, plan: LayerPlan, s: LayerStrategy) -> DeviceMesh:
        return self._meshes((plan.pp, s), stage_mesh, self.cluster, plan.pp, s)

    def env(self, plan: LayerPlan, s: LayerStrategy, prec: Precision) -> TimeEnv:
        key = (plan.pp, s, prec.name)
        return self._envs(key, lambda: time_env(self.cluster, self.calibration, self.mesh(plan, s), s, prec))

    def data_link(self, plan: LayerPlan, s: LayerStrategy, expert: bool = False) -> Link:
        key = (plan.pp, s, expert)
        return self._data_links(key, lambda: data_group_link(self.cluster, self.mesh(plan, s), s, expert))

    def check(self, plan: LayerPlan) -> None:
        """Every block's degrees use exactly the stage's devices (the cluster's, when known)
        (:func:`~.plan_structure.check_plan`)."""
        def check_cp(tp: int, cp: int, comm: str) -> None:
            def allowed() -> None:
                check_context_parallel(self.costs_for(plan.local_batch(plan.first_strategy)).graph, cp, comm, tp)

            self._cp_checked((tp, cp, comm), allowed)

        def experts(u: str, s: LayerStrategy) -> int:
            return self._experts(u, lambda: unit_experts(self.costs_for(plan.local_batch(s)), u))

        check_plan(plan, self._cluster.num_devices if self._cluster is not None else None, check_cp, experts)

    # ---------------------------------------------------------------- costs of one unit
    def unit_cost(self, plan: LayerPlan, u: str, s: LayerStrategy, prec: Precision, timed: bool) -> UnitCost:
        return unit_cost(self, plan, u, s, prec, timed)

    def sync_seconds(self, plan: LayerPlan, s: LayerStrategy, params: Iterable[OwnedParam],
                     prec: Precision, unit_numel: float) -> DataParallelTraffic:
        """:func:`~.gradient_sync.sync_seconds`."""
        return sync_seconds(self, plan, s, params, prec, unit_numel)

    def copy_seconds(self, plan: LayerPlan, s: LayerStrategy, params: Iterable[OwnedParam], prec: Precision,
                     reductions: int) -> float:
        """:func:`~.gradient_sync.copy_seconds`."""
        return copy_seconds(self, plan, s, params, prec, reductions)

    def once_per_step(self, plan: LayerPlan, c: UnitCost, s: LayerStrategy, prec: Precision,
                      synced: set[str], own: bool = True, shared: bool = True) -> tuple[float, float]:
        """:func:`~.gradient_sync.once_per_step`."""
        return once_per_step(self, plan, c, s, prec, synced, own, shared)

    def gathers_under_forward(self, plan: LayerPlan, s: LayerStrategy) -> bool:
        """:func:`~.gradient_sync.gathers_under_forward`."""
        return gathers_under_forward(plan, s)

    def optimizer_seconds(self, states: MemoryBreakdown) -> float:
        return optimizer_seconds(self, states)

    def relayout_seconds(self, plan: LayerPlan, u: str, s: LayerStrategy, prec: Precision) -> float:
        """:func:`~.stage_time.relayout_seconds` (priced afresh; stages keep theirs, :meth:`relayout`)."""
        return relayout_seconds(self, plan, u, s, prec)

    # ---------------------------------------------------------------- whole plans
    def memory(self, plan: LayerPlan) -> PlanMemory:
        return self._plan_memory(plan_key(plan), price_memory, self, plan)

    def time(self, plan: LayerPlan) -> PlanTime:
        return self._plan_time(plan_key(plan), price_time, self, plan)

    # ---------------------------------------------------------------- kept parts (the pricers' protocols)
    def stage_memory(self, plan: LayerPlan, stage: int, layout: PlanLayout) -> StageMemory:
        """:func:`~.stage_memory.stage_memory`, kept per :func:`~.price_keys.stage_memory_key`."""
        return self._stage_memory(stage_memory_key(plan, stage, layout), stage_memory, self, plan, stage, layout)

    def stage_unit_memory(self, plan: LayerPlan, u: str, s: LayerStrategy, prec: Precision, seen: set[str],
                          tied_ids: set[str]) -> UnitMemory:
        """:func:`~.stage_memory.unit_memory`, kept per alike unit for units using no shared
        parameter (``seen`` and ``tied_ids`` do not matter for them)."""
        gc = self.costs_for(plan.local_batch(s))
        if u in gc.param_sharing:
            return unit_memory(self, gc, plan, u, s, prec, seen, tied_ids)
        key = unit_memory_key(plan, gc, u, s, prec)
        kept = self._unit_memory(key, unit_memory, self, gc, plan, u, s, prec, seen, tied_ids)
        return kept if kept.walk.name == u else self._named_units((key, u), kept.named, u)

    def stage_time(self, plan: LayerPlan, stage: int, layout: PlanLayout) -> StageTime:
        """:func:`~.stage_time.stage_time`, kept per :func:`~.price_keys.stage_time_key` (with
        this stage's index)."""
        gc = self.costs_for(plan.local_batch(layout.strat[layout.by_stage[stage][0]]))
        kept = self._stage_time(stage_time_key(plan, stage, layout, gc), stage_time, self, plan, stage, layout)
        return kept if kept.stage == stage else dataclasses.replace(kept, stage=stage)

    def unit_time_parts(self, plan: LayerPlan, u: str, s: LayerStrategy, prec: Precision,
                        synced: set[str]) -> UnitTimeParts:
        """:func:`~.stage_time.unit_time_parts`, kept per alike unit for units using no shared
        parameter (``synced`` does not matter for them)."""
        gc = self.costs_for(plan.local_batch(s))
        if u in gc.param_sharing:
            return unit_time_parts(self, plan, u, s, prec, synced)
        return self._unit_time(unit_time_key(plan, gc, u, s, prec), unit_time_parts, self, plan, u, s, prec, synced)

    def relayout(self, plan: LayerPlan, u: str, s: LayerStrategy, prec: Precision) -> float:
        """:meth:`relayout_seconds`, kept."""
        return self._relayouts(relayout_key(plan, u, s, prec), relayout_seconds, self, plan, u, s, prec)


"""What each kept price depends on: the keys of the evaluator's memos (:mod:`.memo`).

Two requests with equal keys are priced the same, so a kept value is the one pricing afresh
gives. Units that use a parameter another unit shares are priced in place, in stage order (their
part depends on what the units before them used); the others are kept per structurally alike unit.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

from parplan.solver.cost.layer_plan import LayerPlan, LayerStrategy
from parplan.solver.cost.plan_structure import PlanLayout
from parplan.solver.cost.precision import Precision
from parplan.solver.cost.units import GraphCosts


def stage_key(plan: LayerPlan, where: Hashable, names: tuple[str, ...], units: list[str],
              strat: Mapping[str, LayerStrategy]) -> tuple[Any, ...]:
    """What a stage's price depends on: the plan's own fields, ``where`` the stage sits, its units
    (as ``names``) and their strategies."""
    return (plan.pp, plan.num_microbatches, plan.global_batch, plan.schedule, plan.virtual_stages,
            plan.flash_attention, plan.precision, plan.runtime, plan.sync_every_microbatch,
            plan.tp_comm_overlap, plan.overlap_param_gather, plan.overlap_grad_reduce, plan.pp_scatter_gather,
            plan.optimizer_offload, where, names,
            tuple([(strat[u], u in plan.layers) for u in units]))


def stage_memory_key(plan: LayerPlan, stage: int, layout: PlanLayout) -> tuple[Any, ...]:
    """:func:`stage_key` of a stage's memory, with the units of the next stage where the runtime
    keeps the output it sends them."""
    units, by_stage = layout.by_stage[stage], layout.by_stage
    following = (tuple(by_stage[stage + 1]) if plan.runtime.holds_stage_outputs and stage + 1 < len(by_stage)
                 else None)
    return (*stage_key(plan, stage, tuple(units), units, layout.strat), following)


def stage_time_key(plan: LayerPlan, stage: int, layout: PlanLayout, gc: GraphCosts) -> tuple[Any, ...]:
    """:func:`stage_key` of a stage's time: where it sits is only whether it is the first or the
    last stage, and its units are named by their representatives in ``gc`` (alike units cost the
    same). A stage between others receives the same tensors from its neighbours wherever it sits,
    so the middle stages of a pipeline of alike blocks are priced once."""
    units, rep = layout.by_stage[stage], gc.representative
    return stage_key(plan, (stage == 0, stage == plan.pp - 1), tuple([rep[u] for u in units]), units,
                     layout.strat)


def unit_memory_key(plan: LayerPlan, gc: GraphCosts, u: str, s: LayerStrategy, prec: Precision) -> tuple[Any, ...]:
    """What the memory part of a unit that uses no shared parameter depends on."""
    return (plan.global_batch, plan.num_microbatches, plan.flash_attention, plan.runtime, prec.name,
            gc.representative[u], s, u in plan.layers)


def unit_time_key(plan: LayerPlan, gc: GraphCosts, u: str, s: LayerStrategy, prec: Precision) -> tuple[Any, ...]:
    """What the seconds of a unit that uses no shared parameter depend on."""
    return (plan.pp, plan.num_microbatches, plan.global_batch, plan.flash_attention, plan.runtime, prec.name,
            plan.sync_every_microbatch, plan.tp_comm_overlap, plan.overlap_param_gather,
            plan.overlap_grad_reduce, gc.representative[u], s)


def relayout_key(plan: LayerPlan, u: str, s: LayerStrategy, prec: Precision) -> tuple[Any, ...]:
    """What re-laying out the activation entering block ``u`` depends on."""
    return (plan.pp, plan.num_microbatches, plan.global_batch, prec.name, u, s)


def units_key(plan: LayerPlan, batch: int) -> tuple[Any, ...]:
    """What placing the units on stages depends on (``batch``: the first block's local batch; chunks
    looped or in a V)."""
    return (plan.pp, plan.chunks, plan.schedule.v_shape, plan.partition, batch)

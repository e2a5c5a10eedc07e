"""Step time of a :class:`~.layer_plan.LayerPlan`, stage by stage.

Per stage, one micro-batch: every unit's compute and tensor-parallel collectives (its local batch
is ``global_batch / (m · dp)``), a re-layout all-to-all of the activation between consecutive
blocks whose layouts differ, and the point-to-point transfers between stages. Once per step: each
unit's data-parallel work (:mod:`.gradient_sync`) and Adam's memory-bound update.

A step takes ``m·t_max + (Σ_s t_s − t_max)/v`` plus the slowest stage's once-per-step work (the
zero-bubble schedules: :func:`zero_bubble_seconds`).

Pure functions: what they ask of the memo layer is :class:`TimePricer`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

from parplan.solver.cluster import Link
from parplan.solver.cost.collectives import all_gather_seconds, all_to_all_seconds, p2p_seconds
from parplan.solver.cost.gradient_sync import once_per_step
from parplan.solver.cost.layer_plan import LayerPlan, LayerStrategy
from parplan.solver.cost.memory import MemoryBreakdown
from parplan.solver.cost.offload import CPU_ADAM_ELEMENTS_PER_S, offload_seconds, offloaded_elements
from parplan.solver.cost.plan_structure import Links, PlanLayout, plan_layout, unit_cost
from parplan.solver.cost.precision import Precision
from parplan.solver.cost.rules import optimizer_step_seconds
from parplan.solver.cost.stage_memory import model_states
from parplan.solver.cost.zero_bubble import dualpipev_orders, interleaved_zb_bubble, v_makespan, zbv_makespan
from parplan.solver.strategy import Schedule


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
    #: of ``backward_seconds``, the weight gradients of the GEMMs with a weight (a zero-bubble schedule's W)
    weight_grad_seconds: float = 0.0

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


class UnitTimeParts(NamedTuple):
    """One unit's seconds: of one micro-batch (forward, backward, recompute, TP collectives, the
    exposed part of its context-parallel exchange, its expert-parallel all-to-alls), and per step
    (gradient traffic, of it what overlap does not hide, optimizer)."""

    forward: float
    backward: float
    recompute: float
    tp: float
    traffic: float
    exposed: float
    optimizer: float
    cp: float
    ep: float
    optimizer_elements: float = 0.0  # elements of the optimizer's shard it steps (.offload)
    weight_grad: float = 0.0


class TimePricer(Links, Protocol):
    """What the time functions ask of the memo layer."""

    def unit_time_parts(self, plan: LayerPlan, u: str, s: LayerStrategy, prec: Precision,
                        synced: set[str]) -> UnitTimeParts: ...

    def relayout(self, plan: LayerPlan, u: str, s: LayerStrategy, prec: Precision) -> float: ...

    def stage_time(self, plan: LayerPlan, stage: int, layout: PlanLayout) -> StageTime: ...


def pipeline_seconds(per_microbatch: list[float], once: list[float], m: int, v: int) -> float:
    """Step time from each stage's per-micro-batch and once-per-step seconds."""
    t_max = max(per_microbatch)
    return m * t_max + (sum(per_microbatch) - t_max) / v + max(once)


def zero_bubble_seconds(stages: list[StageTime], schedule: Schedule, m: int, v: int) -> float:
    """Step time under a zero-bubble schedule (:mod:`.zero_bubble`), each device's micro-batch cut
    into F (its forward), W (its weight gradients) and B (the rest: input gradients, recomputation,
    communication): ``interleaved-zb`` ``m·t_max`` plus its bubble, ``zbv`` and ``dualpipev`` the
    makespan of their orders; plus the slowest stage's once-per-step work."""
    forward = [s.forward_seconds for s in stages]
    weight = [s.weight_grad_seconds for s in stages]
    rest = [s.microbatch_seconds - f - w for s, f, w in zip(stages, forward, weight, strict=True)]
    once = max(s.step_seconds for s in stages)
    per = [s.microbatch_seconds for s in stages]
    busy = m * max(per)  # the slowest device's own work, which no order shortens (rounding apart)
    if schedule is Schedule.ZBV:
        return max(busy, zbv_makespan(forward, rest, weight, m)) + once
    if schedule is Schedule.DUALPIPEV:
        return max(busy, v_makespan(dualpipev_orders(len(stages), m), forward, rest, weight)) + once
    return busy + max(0.0, interleaved_zb_bubble(forward, rest, weight, per.index(max(per)), v)) + once


def optimizer_seconds(p: Links, states: MemoryBreakdown) -> float:
    """Adam's update of these model states (memory bound)."""
    return optimizer_step_seconds(states, p.cluster.gpu, p.calibration)


def price_time(p: TimePricer, plan: LayerPlan) -> PlanTime:
    """The step time of ``plan``: every stage's (:meth:`TimePricer.stage_time`), pipelined."""
    layout = plan_layout(p, plan)
    stages = [p.stage_time(plan, stage, layout) for stage in range(len(layout.by_stage))]
    if plan.schedule.zero_bubble:
        step = zero_bubble_seconds(stages, plan.schedule, plan.num_microbatches, plan.chunks)
    else:
        step = pipeline_seconds([s.microbatch_seconds for s in stages], [s.step_seconds for s in stages],
                                plan.num_microbatches, plan.chunks)
    gc = p.costs_for(plan.local_batch(plan.first_strategy))
    seq = int(gc.graph.meta.get("seq_len", 0) or 0)
    return PlanTime(tuple(stages), step, plan.global_batch * seq, plan.num_microbatches)


def unit_time_parts(p: Links, plan: LayerPlan, u: str, s: LayerStrategy, prec: Precision,
                    synced: set[str]) -> UnitTimeParts:
    """Unit ``u``'s seconds under ``s`` (:class:`UnitTimeParts`); ``synced`` collects the shared
    parameters already synchronised on its stage."""
    c = unit_cost(p, plan, u, s, prec, timed=True)
    traffic, hidden_not = once_per_step(p, plan, c, s, prec, synced)
    tp = c.tp_comm_seconds
    if plan.tp_comm_overlap:
        # Transformer Engine runs each all-gather / reduce-scatter in chunks under the GEMM that
        # consumes or produces it: hidden up to the unit's GEMM time (forward, backward, recomputed)
        tp = max(0.0, tp - c.matmul_seconds)
    states = model_states(c.params, s, plan.runtime.states_precision(prec)).bytes
    return UnitTimeParts(c.forward_seconds, c.backward_seconds, c.recompute_seconds, tp, traffic, hidden_not,
                         optimizer_seconds(p, states), c.cp_comm_seconds, c.ep_comm_seconds,
                         offloaded_elements(states, prec, 1.0), c.weight_grad_seconds)


def stage_time(p: TimePricer, plan: LayerPlan, stage: int, layout: PlanLayout) -> StageTime:
    """One stage's seconds (see the module's docstring)."""
    units, strat, prec = layout.by_stage[stage], layout.strat, layout.prec
    fwd = bwd = rec = tp = relayout = cp_exposed = ep = wgrad = 0.0
    sync_total = exposed = opt = elements = 0.0
    previous: LayerStrategy | None = None
    synced: set[str] = set()  # shared parameters synchronised once per stage
    for u in units:
        s = strat[u]
        part = p.unit_time_parts(plan, u, s, prec, synced)
        fwd += part.forward
        bwd += part.backward
        wgrad += part.weight_grad
        rec += part.recompute
        tp += part.tp
        cp_exposed += part.cp
        ep += part.ep
        sync_total += part.traffic
        exposed += part.exposed
        opt += part.optimizer
        elements += part.optimizer_elements
        if previous is not None and previous is not s and previous.layout_key != s.layout_key:
            relayout += p.relayout(plan, u, s, prec)
        previous = s
    first = strat[units[0]]
    gc = p.costs_for(plan.local_batch(first))
    shared = gc.shared_param_elems(units, first.unit(plan.flash_attention, plan.runtime))
    if shared:
        states = model_states(shared, first, plan.runtime.states_precision(prec)).bytes
        opt += optimizer_seconds(p, states)
        elements += offloaded_elements(states, prec, 1.0)
    if plan.optimizer_offload:
        opt = offloaded_step_seconds(p, plan.optimizer_offload, opt, elements, prec)
    p2p = 0.0
    if plan.pp > 1:
        link = p.mesh(plan, first).hop_link("pp", p.cluster)
        boundary = gc.boundary_bytes(units, lambda x: layout.unit_stage.get(x, 0), stage,
                                     first.unit(plan.flash_attention, plan.runtime), prec.activation_bytes)
        p2p = sum(2 * handoff_seconds(p, plan, first, b, link) for b in boundary)
    return StageTime(stage, fwd, bwd, rec, tp, p2p, sync_total, exposed, opt, relayout, cp_exposed, ep, wgrad)


def offloaded_step_seconds(p: Links, fraction: float, gpu_seconds: float, elements: float,
                           prec: Precision) -> float:
    """The optimizer step of a stage whose devices step ``elements`` each with ``fraction`` of them
    on the host: the GPU's step on the rest, then the copies and the host's step (:mod:`.offload`)."""
    cluster = p.cluster
    return gpu_seconds * (1 - fraction) + offload_seconds(fraction * elements, prec, cluster.gpu.host_link_bytes_per_s,
                                                          cluster.gpus_per_host, CPU_ADAM_ELEMENTS_PER_S)


def handoff_seconds(p: Links, plan: LayerPlan, s: LayerStrategy, nbytes: float, link: Link) -> float:
    """Seconds of one pipeline hand-off of ``nbytes`` per device over ``link``. Under
    ``plan.pp_scatter_gather`` a tensor every TP rank holds whole (no sequence parallelism)
    travels as ``tp`` shares, each rank sending its own, and is all-gathered over TP after."""
    if not (plan.pp_scatter_gather and s.tp > 1 and not s.sp):
        return p2p_seconds(nbytes, link)
    tp_link = p.mesh(plan, s).group_link(("tp",), p.cluster)
    return p2p_seconds(nbytes / s.tp, link) + all_gather_seconds(s.tp, nbytes, tp_link)


def relayout_seconds(p: Links, plan: LayerPlan, u: str, s: LayerStrategy, prec: Precision) -> float:
    """Re-distributing the activation entering block ``u`` when its layout differs from the
    previous block's: an all-to-all over the stage's devices, forward and backward."""
    gc = p.costs_for(plan.local_batch(s))
    n = s.tp * s.cp * s.dp
    mesh = p.mesh(plan, s)
    link = mesh.group_link([a for a, size in mesh.axes if a != "pp" and size > 1], p.cluster)
    full = sum(gc.graph.node(i).numel for i in gc.external_inputs[u]) * prec.activation_bytes * s.dp
    return 2 * all_to_all_seconds(n, full / n, link)

"""Memory of a pipeline stage's devices under a :class:`~.layer_plan.LayerPlan`.

Per stage and device: model states of every unit's parameters under that unit's TP/DP/ZeRO
(shared parameters such as a tied embedding once per stage), activations of one micro-batch times
the stage's in-flight count, and the temporary peak; the stage's peak is the busiest moment of the
step, found by walking its forward and backward (:func:`~.peak.stage_peak`). Under the interleaved
schedule a device's chunks are walked in the rank's own order (:func:`interleaved_stage_memory`).

Pure functions: what they ask of the memo layer is :class:`MemoryPricer`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from parplan.solver.cost.backward import BackwardProfile
from parplan.solver.cost.layer_plan import LayerPlan, LayerStrategy, group_ranks, shard_ranks, tensor_ranks
from parplan.solver.cost.memory import Memory, MemoryBreakdown
from parplan.solver.cost.offload import device_states, host_bytes
from parplan.solver.cost.peak import StageUnit, stage_peak, stage_unit
from parplan.solver.cost.pipeline import in_flight_microbatches, rank_order, virtual_stage_of
from parplan.solver.cost.plan_structure import Links, PlanLayout, plan_layout, unit_cost, virtual_stages
from parplan.solver.cost.precision import Precision
from parplan.solver.cost.rules import optimizer_temporary_bytes, parameter_states
from parplan.solver.cost.runtime import DataParallelBuffers
from parplan.solver.cost.units import GraphCosts, ParamGroup, UnitCost
from parplan.solver.strategy import Schedule


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
    #: host bytes each of its devices' offloaded optimizer holds (:mod:`.offload`)
    host_bytes: float = 0.0


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

    @property
    def host_bytes_per_device(self) -> float:
        """The most host memory one device's offloaded optimizer holds, over the stages."""
        return max(s.host_bytes for s in self.stages)


@dataclass(frozen=True)
class UnitMemory:
    """One unit's part of its stage's memory."""

    walk: StageUnit  # its entry in the stage's walk
    states: tuple[float, ...]  # model states by category: bytes, then redundant
    rebuilds_buckets: bool  # DDP keeps a second copy of its gradients
    act_bytes: float
    act_redundant_bytes: float
    largest_param_elems: float

    def named(self, name: str) -> UnitMemory:
        """The same part for an alike unit called ``name``."""
        return dataclasses.replace(self, walk=dataclasses.replace(self.walk, name=name))


class MemoryPricer(Links, Protocol):
    """What the memory functions ask of the memo layer."""

    def stage_unit_memory(self, plan: LayerPlan, u: str, s: LayerStrategy, prec: Precision, seen: set[str],
                          tied_ids: set[str]) -> UnitMemory: ...

    def stage_memory(self, plan: LayerPlan, stage: int, layout: PlanLayout) -> StageMemory: ...


def model_states(groups: Mapping[ParamGroup, float], s: LayerStrategy, prec: Precision,
                 shards_parameters: bool | None = None) -> Memory:
    """Weights, gradients and optimizer states of parameter elements, with ZeRO over the data
    axes: dense parameters shard over all ``dp x cp`` ranks, expert parameters over ``dp x cp / ep``
    (Megatron-LM's distributed optimizer shards over the data-and-context-parallel group), or under
    hybrid sharding over one shard group (:func:`~.layer_plan.shard_ranks`).
    ``shards_parameters``: whether the weights are sharded between steps (default: ZeRO-3; the
    runtime decides, see :meth:`~parplan.solver.cost.runtime.Runtime.data_parallel`)."""
    total = Memory(MemoryBreakdown(), MemoryBreakdown())
    for group, elems in groups.items():
        nz = shard_ranks(s, group.expert)
        replicas = (tensor_ranks(s, group.expert) if group.tp_replicated else 1) * group_ranks(s, group.expert)
        total = total + Memory(*parameter_states(elems, prec, s.zero, nz, replicas, shards_parameters))
    return total


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
    rebuilt = s.recompute.rebuilds_blocks or s.recompute.per_module  # a block, or its checkpointed modules
    peak = max(workspace + (c.recompute_peak_bytes if rebuilt else 0.0),
               c.logits_grad_bytes, c.cp_buffer_bytes, forward_transient,
               profile.peak - c.act_bytes if profile is not None else 0.0)
    if s.zero >= 3 and is_block:
        peak = max(peak, c.param_gathered_bytes + c.param_elems_all * 3 * prec.grad_bytes + workspace)
    if is_block and dp is not None and dp.gathers and profile is not None:
        copies = 1 if dp.kept_from_forward else 2
        peak = max(peak, copies * c.param_gathered_bytes + c.param_elems_all * dp.reduce_buffers * prec.grad_bytes
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


def unit_memory(p: Links, gc: GraphCosts, plan: LayerPlan, u: str, s: LayerStrategy, prec: Precision,
                seen: set[str], tied_ids: set[str]) -> UnitMemory:
    """Unit ``u``'s part of its stage's memory under ``s`` (``gc``: the graph costs at its local
    batch; ``seen``: the parameters the units before it used, to which it adds its own;
    ``tied_ids``: the stage's parameters several units read)."""
    c = unit_cost(p, plan, u, s, prec, timed=False)
    dp = plan.runtime.data_parallel(s.tp, s.data_ranks, s.zero)
    walk = stage_unit(u, gc, s.unit(plan.flash_attention, plan.runtime), c, u in plan.layers, dp, prec, seen,
                      tied_ids)
    st = model_states(c.params, s, plan.runtime.states_precision(prec, dp), dp.shards_parameters)
    floats = (*st.bytes.as_floats().values(), *st.redundant.as_floats().values())
    return UnitMemory(walk, floats, dp.rebuilds_buckets, c.act_bytes, c.act_redundant_bytes, c.largest_param_elems)


def shared_states(gc: GraphCosts, plan: LayerPlan, units: list[str], first: LayerStrategy,
                  prec: Precision) -> tuple[Memory, DataParallelBuffers]:
    """The model states of the parameters several of ``units`` share (under the first unit's
    strategy ``first``, once per stage; ``gc``: the graph costs at its local batch), and that
    strategy's data-parallel buffers."""
    first_dp = plan.runtime.data_parallel(first.tp, first.data_ranks, first.zero)
    states = model_states(gc.shared_param_elems(units, first.unit(plan.flash_attention, plan.runtime)), first,
                          plan.runtime.states_precision(prec, first_dp), first_dp.shards_parameters)
    return states, first_dp


def offloaded(plan: LayerPlan, states: Memory, prec: Precision) -> tuple[Memory, float]:
    """A device's model states with ``plan.optimizer_offload`` of its optimizer on the host, and the
    host bytes that takes (:mod:`.offload`)."""
    f = plan.optimizer_offload
    if not f:
        return states, 0.0
    return (Memory(device_states(states.bytes, f), device_states(states.redundant, f)),
            host_bytes(states.bytes, prec, f))


@dataclass
class _StageSums:
    """What a stage's units add up to, in unit order."""

    walk: list[StageUnit]
    unit_grads: list[float]  # each unit's gradient bytes
    sums: list[float]  # model states by category: bytes, then redundant
    rebuilt_buckets: float = 0.0  # DDP's second copy of the gradients
    act: float = 0.0
    act_red: float = 0.0
    largest: float = 0.0

    @property
    def states(self) -> Memory:
        return Memory(MemoryBreakdown(*self.sums[:5]), MemoryBreakdown(*self.sums[5:]))


def _stage_sums(p: MemoryPricer, plan: LayerPlan, units: list[str], strat: Mapping[str, LayerStrategy],
                prec: Precision) -> _StageSums:
    tied_ids = p.costs_for(plan.local_batch(strat[units[0]])).tied_ids(units)
    seen: set[str] = set()
    out = _StageSums([], [], [0.0] * 10)
    for u in units:
        part = p.stage_unit_memory(plan, u, strat[u], prec, seen, tied_ids)
        out.walk.append(part.walk)
        out.unit_grads.append(part.states[1])
        for k in range(10):
            out.sums[k] += part.states[k]
        # DDP's second copy of the gradients, once (see cost.runtime; not measured under
        # torch.distributed.pipelining, which drives DDP's synchronisation itself)
        out.rebuilt_buckets += part.states[1] if part.rebuilds_buckets and plan.pp == 1 else 0.0
        out.act += part.act_bytes
        out.act_red += part.act_redundant_bytes
        out.largest = max(out.largest, part.largest_param_elems)
    return out


def stage_memory(p: MemoryPricer, plan: LayerPlan, stage: int, layout: PlanLayout) -> StageMemory:
    """One stage's memory under 1F1B or GPipe (see the module's docstring)."""
    units, strat, prec = layout.by_stage[stage], layout.strat, layout.prec
    sums = _stage_sums(p, plan, units, strat, prec)
    first = strat[units[0]]
    gc = p.costs_for(plan.local_batch(first))
    us = first.unit(plan.flash_attention, plan.runtime)
    shared, first_dp = shared_states(gc, plan, units, first, prec)
    states, host = offloaded(plan, sums.states + shared, prec)
    rebuilt_buckets = sums.rebuilt_buckets + (shared.bytes.gradients if first_dp.rebuilds_buckets and plan.pp == 1
                                              else 0.0)
    shared_act, shared_red = gc.shared_item_bytes(units, us, prec.activation_bytes, prec.te_fp8)
    receive = pinned = sent = 0.0  # pipelining's receive buffers; a sent output its send keeps
    if plan.runtime.holds_stage_outputs and plan.pp > 1:
        received, saved_there, sent = pipeline_boundaries(p, plan, stage, layout.by_stage, layout.unit_stage,
                                                          strat, prec)
        # the output sent to the next stage, kept until this micro-batch's backward; a
        # received input saved for backward lives in its receive buffer
        shared_act += sent - saved_there
        receive = plan.num_microbatches * (received + sent)  # activations in, gradients in
    act = sums.act + shared_act
    act_red = sums.act_red + shared_red
    flight = in_flight_microbatches(stage, plan.pp, plan.num_microbatches, plan.schedule, plan.virtual_stages)
    if plan.runtime.holds_stage_outputs and plan.schedule is Schedule.ONE_F_ONE_B and flight >= 2:
        # PyTorch's 1F1B keeps the handle of the first warm-up send until the steady phase
        # ends, and the handle keeps that micro-batch's output alive after its backward
        pinned = sent
    # gradients made in backward (torchtitan sets them to None between steps); with pipelining
    # other micro-batches' backwards run before, so they count as resident there
    grads_later = not plan.runtime.keeps_gradients and plan.pp == 1
    # nanotron: each micro-batch's backward makes compute-type gradients beside the resident buffer,
    # freed when it ends (Runtime.grads_each_microbatch): the walk of every micro-batch is the first's
    anew = plan.runtime.grads_each_microbatch
    walked = stage_peak(sums.walk, prec, shared_act, gc.tied_within(units, us), gc.tied_gradient_workspace(units, us),
                        accumulating=_accumulating(plan), pipelined=_pipelined(plan),
                        created_grads=(sums.unit_grads if grads_later
                                       else [u.own_param_bytes for u in sums.walk] if anew else None),
                        shared_grads=shared.bytes.gradients if grads_later else 0.0,
                        later_microbatches=plan.num_microbatches > 1 and not anew, transient_grads=anew)
    optimizer = optimizer_temporary_bytes(sums.largest, prec)
    resident = states.bytes.total
    walk_base = resident - states.bytes.gradients if grads_later else resident
    peak = max(walk_base + act * (flight - 1) + walked.above_resident, resident + optimizer,
               resident + rebuilt_buckets)
    fixed = receive + plan.runtime.held_through_step_bytes  # held through the whole step
    held = states.bytes.replace(activations=act * flight + pinned,
                                temporary=max(walked.temporary, optimizer, rebuilt_buckets) + fixed)
    red = states.redundant.replace(activations=act_red * flight)
    return StageMemory(stage, tuple(units), Memory(held, red), act, flight, peak + fixed + pinned, host)


def _accumulating(plan: LayerPlan) -> bool:
    """Whether gathering units keep their unsharded gradients over the step's micro-batches
    (:meth:`~parplan.solver.cost.runtime.Runtime.accumulates_unsharded`)."""
    return (plan.num_microbatches > 1 and plan.runtime.accumulates_unsharded(plan.pp > 1)
            and not plan.sync_every_microbatch)


def _pipelined(plan: LayerPlan) -> bool:
    """Whether ``torch.distributed.pipelining`` runs the stages (its FSDP2 handling, stage outputs)."""
    return plan.pp > 1 and plan.runtime.holds_stage_outputs


def pipeline_boundaries(p: Links, plan: LayerPlan, stage: int, by_stage: list[list[str]],
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
        gc = p.costs_for(plan.local_batch(first))
        us = first.unit(plan.flash_attention, plan.runtime)
        received = sum(gc.boundary_bytes(units, stage_of, stage, us, prec.activation_bytes))
        ids = {i for u in units for i in gc.external_inputs[u] if stage_of(gc.unit_of[i]) != stage}
        items = gc.saved(us.recompute, us.flash_attention, prec.activation_bytes, us.runtime, prec.te_fp8)[0]
        saved = gc.item_bytes((it for u in units for it in items[u] if it.key in ids), us)[0]
    if stage < (stages or plan.pp) - 1:
        sent = sum(p.costs_for(plan.local_batch(last)).boundary_bytes(
            by_stage[stage + 1], stage_of, stage + 1, last.unit(plan.flash_attention, plan.runtime),
            prec.activation_bytes))
    return received, saved, sent


@dataclass
class _Interleaved:
    """A device's chunks under interleaved 1F1B, added up chunk by chunk in forward order."""

    states: Memory
    largest: float = 0.0
    receive: float = 0.0  # receive buffers, held through the step
    acts: list[float] = dataclasses.field(default_factory=list)  # each chunk's activations of one micro-batch
    reds: list[float] = dataclasses.field(default_factory=list)  # of them redundant
    walks: list[float] = dataclasses.field(default_factory=list)  # each chunk's walk above resident
    sent: list[float] = dataclasses.field(default_factory=list)  # each chunk's output sent
    grads_sent: list[float] = dataclasses.field(default_factory=list)  # each chunk's input gradient sent back
    kept: list[tuple[float, float]] = dataclasses.field(default_factory=list)  # (weights, grads) kept unsharded


def _add_chunk(p: Links, plan: LayerPlan, vs: int, chunk: list[str], all_by_vstage: list[list[str]],
               virtual: Mapping[str, int], strat: Mapping[str, LayerStrategy], prec: Precision,
               acc: _Interleaved) -> None:
    """Add virtual stage ``vs`` (its units ``chunk``) to ``acc``."""
    first = strat[chunk[0]]
    gc = p.costs_for(plan.local_batch(first))
    us = first.unit(plan.flash_attention, plan.runtime)
    walk: list[StageUnit] = []
    seen: set[str] = set()
    tied_ids = gc.tied_ids(chunk)
    act = red = 0.0
    for u in chunk:
        s = strat[u]
        c = unit_cost(p, plan, u, s, prec, timed=False)
        dp = plan.runtime.data_parallel(s.tp, s.data_ranks, s.zero)
        walk.append(stage_unit(u, p.costs_for(plan.local_batch(s)), s.unit(plan.flash_attention, plan.runtime), c,
                               u in plan.layers, dp, prec, seen, tied_ids))
        acc.states = acc.states + model_states(c.params, s, plan.runtime.states_precision(prec, dp),
                                               dp.shards_parameters)
        act += c.act_bytes
        red += c.act_redundant_bytes
        acc.largest = max(acc.largest, c.largest_param_elems)
    shared_act, shared_red = gc.shared_item_bytes(chunk, us, prec.activation_bytes, prec.te_fp8)
    out = received = 0.0
    if plan.runtime.holds_stage_outputs:
        received, saved_there, out = pipeline_boundaries(p, plan, vs, all_by_vstage, virtual, strat, prec,
                                                         len(all_by_vstage))
        shared_act += out - saved_there
        acc.receive += plan.num_microbatches * (received + out)  # activations in, gradients in
    acc.acts.append(act + shared_act)
    acc.reds.append(red + shared_red)
    walked = stage_peak(walk, prec, shared_act, gc.tied_within(chunk, us), gc.tied_gradient_workspace(chunk, us),
                        accumulating=_accumulating(plan), pipelined=_pipelined(plan))
    acc.walks.append(walked.above_resident)
    acc.kept.append((walked.kept_weights, walked.kept_grads))
    acc.sent.append(out)
    acc.grads_sent.append(received)  # the input gradient sent back is the size of the input received


def _rank_order_peaks(acc: _Interleaved, plan: LayerPlan, stage: int) -> tuple[float, float]:
    """(the most above resident memory, the most activations) over the rank's own order of
    forwards and backwards (:func:`~.pipeline.rank_order`). A zero-bubble schedule's input gradient
    (I) runs the chunk's backward walk and keeps its activations: ``stage_backward_input`` retains
    the autograd graph until the weight gradient (W) frees it."""
    v = len(acc.acts)
    torch = plan.runtime.holds_stage_outputs
    m = plan.num_microbatches
    live, forwards, backwards = [0] * v, [0] * v, [0] * v
    above = act_peak = 0.0
    for kind, k in rank_order(plan.schedule, plan.pp, v, m, stage):
        if kind == "F":
            live[k] += 1
            forwards[k] += 1
        if kind == "W":  # the weight gradient frees what the input gradient kept for it
            live[k] -= 1
            continue
        held = sum(n * a for n, a in zip(live, acc.acts, strict=True))
        # PyTorch keeps every send's handle, and what it sent, until the step ends
        handles = sum((f - n) * o + b * g for f, n, b, o, g in zip(forwards, live, backwards, acc.sent,
                                                                  acc.grads_sent, strict=True)) if torch else 0.0
        # the other chunks' weights, gathered since their first forward, and their unsharded
        # gradients, accumulated since their first backward, until their last backward (the chunk's
        # own are in its walk): torch.distributed.pipelining's stage.backward_maybe_with_nosync
        # turns FSDP2's reshard after backward and gradient sync off for all but a stage's last
        others = sum((w if forwards[j] else 0.0) + (g if backwards[j] else 0.0)
                     for j, (w, g) in enumerate(acc.kept) if j != k and backwards[j] < m)
        act_peak = max(act_peak, held + handles)
        above = max(above, held - acc.acts[k] + acc.walks[k] + handles + others)
        if kind == "B":
            live[k] -= 1
        if kind in ("B", "I"):
            backwards[k] += 1
    return above, act_peak


def interleaved_stage_memory(p: Links, plan: LayerPlan, stage: int, virtual: Mapping[str, int],
                             layout: PlanLayout) -> StageMemory:
    """A device's memory under interleaved 1F1B: its ``v`` chunks hold different activations and
    different numbers of micro-batches in flight, so the peak comes from the rank's own order of
    forwards and backwards (:func:`~.pipeline.interleaved_rank_order`): at each backward the
    in-flight micro-batches of every chunk and that chunk's walk. PyTorch's schedule also keeps
    a receive buffer per virtual stage boundary and micro-batch, and every send's handle, with
    the output or input gradient it sent, until the step ends."""
    units, strat, prec = layout.by_stage[stage], layout.strat, layout.prec
    pp, v = plan.pp, plan.chunks
    by_vstage: list[list[str]] = [[] for _ in range(pp * v)]
    for u in units:
        by_vstage[virtual[u]].append(u)
    all_by_vstage: list[list[str]] = [[] for _ in range(pp * v)]
    for u, vs in virtual.items():
        all_by_vstage[vs].append(u)
    order = {u: k for k, u in enumerate(p.costs_for(plan.local_batch(strat[units[0]])).units)}
    for lst in all_by_vstage:
        lst.sort(key=order.__getitem__)
    acc = _Interleaved(Memory(MemoryBreakdown(), MemoryBreakdown()))
    for k in range(v):
        vs = virtual_stage_of(stage, k, pp, plan.schedule)
        _add_chunk(p, plan, vs, by_vstage[vs], all_by_vstage, virtual, strat, prec, acc)
    above, act_peak = _rank_order_peaks(acc, plan, stage)
    first = strat[units[0]]
    shared, _ = shared_states(p.costs_for(plan.local_batch(first)), plan, units, first, prec)
    states, host = offloaded(plan, acc.states + shared, prec)
    optimizer = optimizer_temporary_bytes(acc.largest, prec)
    resident = states.bytes.total
    per_micro = sum(acc.acts)
    flight = act_peak / per_micro if per_micro else 0.0
    fixed = acc.receive + plan.runtime.held_through_step_bytes  # held through the whole step
    temp = max(above - act_peak, optimizer, 0.0) + fixed
    held_bytes = states.bytes.replace(activations=act_peak, temporary=temp)
    red_bytes = states.redundant.replace(activations=sum(acc.reds) * flight)
    return StageMemory(stage, tuple(units), Memory(held_bytes, red_bytes), per_micro, flight,
                       max(resident + above, resident + optimizer) + fixed, host)


def price_memory(p: MemoryPricer, plan: LayerPlan) -> PlanMemory:
    """The memory of every stage of ``plan`` (1F1B and GPipe stages by :meth:`MemoryPricer.stage_memory`)."""
    layout = plan_layout(p, plan)
    stages = range(len(layout.by_stage))
    if plan.chunks > 1 or plan.schedule.zero_bubble:
        virtual = virtual_stages(p.costs_for(plan.local_batch(plan.first_strategy)), plan)
        return PlanMemory(tuple(interleaved_stage_memory(p, plan, stage, virtual, layout) for stage in stages))
    return PlanMemory(tuple(p.stage_memory(plan, stage, layout) for stage in stages))

"""The moment of a training step at which a pipeline stage holds the most memory.

Adding every category's own peak over-predicts: the temporaries of backward (a gradient
workspace, FSDP's gathered weights and unsharded gradients, a recomputed block) peak after part of
the activations is already freed. This walk follows one micro-batch's backward through a stage,
unit by unit, last unit first, while the resident model states and the other in-flight
micro-batches' activations stay; inside a unit, saved tensors are freed operator by operator
(:mod:`.backward`). At each moment the stage holds, besides those:

- the saved tensors of the units before the current one, and the current unit's own that its
  backward has not freed yet, plus its running operator's gradients;
- by how each unit's data parallelism runs (:class:`~parplan.solver.cost.runtime.DataParallelBuffers`):
  units outside the blocks (embedding, head) that gather keep their weights gathered from forward
  to the end of backward, and their unsharded gradients accumulate until then; a gathering block
  runs its backward with its own weights gathered and, unless every block keeps its copy from
  forward, the next block's (in backward order) prefetched; the copies that blocks keep from
  forward stay until their own backward ends; when a block's backward ends its weights are freed,
  the previous reduce buffers released, and its unsharded gradients copied into new ones;
- a tied embedding's gradient from the LM head (whose backward comes first) waits through the rest
  of backward for the embedding's own; at the embedding's backward both and their sum coexist.

The stage's other busy moment is the optimizer step (Adam's two temporaries the size of the largest
tensor, after the activations are freed). Bytes per device throughout.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from parplan.solver.cost.backward import BackwardProfile
from parplan.solver.cost.loss_loop import LossLoop, loop_peak
from parplan.solver.cost.precision import Precision
from parplan.solver.cost.runtime import DataParallelBuffers
from parplan.solver.cost.unit_strategy import UnitStrategy, local_elems
from parplan.solver.cost.units import GraphCosts, UnitCost


@dataclass(frozen=True)
class StageUnit:
    """One unit of the stage, in forward order: what the walk needs of it (bytes per device)."""

    name: str
    is_block: bool
    dp: DataParallelBuffers
    act_bytes: float  # saved for backward (the stage's shared buffers apart)
    profile: BackwardProfile
    forward_transient: float  # its forward's unsaved outputs at their most
    gathered_bytes: float  # every weight it uses, unsharded (what gathering holds)
    unsharded_grad_bytes: float  # every weight's gradient, unsharded
    own_param_bytes: float  # weights of parameters first used here (a stage's shared ones once)
    own_grad_bytes: float  # their gradients, a tied table's apart
    tied_user: bool = False  # it reads a parameter another unit of the stage reads
    loss_loop: LossLoop | None = None  # a chunked loss run by its forward (backward included)


@dataclass(frozen=True)
class StagePeak:
    above_resident: float  # one micro-batch's saved tensors + every temporary, at the busiest moment
    temporary: float  # the temporaries' own peak over the step (gathered weights, gradients, buffers)


def stage_unit(name: str, costs: GraphCosts, strategy: UnitStrategy, cost: UnitCost, is_block: bool,
               dp: DataParallelBuffers, prec: Precision, seen: set[str], tied_ids: set[str]) -> StageUnit:
    """The walk's view of one unit priced by :class:`~parplan.solver.cost.units.GraphCosts`;
    ``seen`` collects the parameters units before it used (each counted once)."""
    own = [p for p in costs.params[name] if p.id not in seen]
    seen.update(p.id for p in own)
    own_elems = sum(local_elems(p, strategy) for p in own)
    untied = sum(local_elems(p, strategy) for p in own if p.id not in tied_ids)
    return StageUnit(name, is_block, dp, cost.act_bytes, costs.backward_profile(name, strategy, prec),
                     costs.forward_transient(name, strategy, prec), cost.param_elems_all * prec.param_bytes,
                     cost.param_elems_all * prec.grad_bytes, own_elems * prec.param_bytes, untied * prec.grad_bytes,
                     any(p.id in tied_ids for p in costs.params[name]), costs.loss_loop(name, strategy, prec))


def stage_peak(units: Sequence[StageUnit], prec: Precision, shared_act_bytes: float, tied_elems: float,
               tied_workspace_elems: float, accumulating: bool = False, pipelined: bool = False,
               created_grads: Sequence[float] | None = None, shared_grads: float = 0.0,
               later_microbatches: bool = False) -> StagePeak:
    """The busiest moment of one micro-batch's forward and backward through ``units`` (forward
    order), above the resident model states and the other micro-batches in flight.

    ``shared_act_bytes``: saved tensors several units share, freed only at the end;
    ``tied_elems``: local elements of parameters two units of the stage use (a tied embedding);
    ``tied_workspace_elems``: the gradient elements the first user's backward makes for them;
    ``accumulating``: the step accumulates gradients over several micro-batches, and gathering
    units keep their unsharded gradients from the first micro-batch's backward until the last's
    (FSDP2 without gradient synchronisation), so every micro-batch but the first sees all of them;
    ``pipelined``: with that, gathering units also keep their weights gathered from their first
    backward until the last (``torch.distributed.pipelining`` turns resharding after backward off
    for every micro-batch but the last), so later micro-batches gather nothing.

    ``created_grads``: the resident gradient bytes of each unit when the runtime frees gradients
    between steps (torchtitan): the caller's resident states leave them out, a unit's appear when its
    backward ends, and ``shared_grads`` (parameters several units share) from the start of backward;
    every micro-batch after the first (``later_microbatches``: the step has several) finds all of them."""
    w = _Walk(units, shared_act_bytes)
    later = later_microbatches and created_grads is not None  # later micro-batches find the made gradients
    # after[i]: gradients made by the units after i (suffix sums; all zero when none are made in backward)
    after = [0.0] * (len(units) + 1)
    if created_grads is not None:
        for i in reversed(range(len(units))):
            after[i] = after[i + 1] + created_grads[i]
    all_made = after[0] + shared_grads

    def made_by(i: int, including: bool = False) -> float:
        """Gradients alive in the last micro-batch's backward at unit ``i`` (units after it done)."""
        if accumulating or later:
            return all_made
        return shared_grads + after[i if including else i + 1]

    tied = tied_elems * prec.grad_bytes
    tied_users = [i for i, u in enumerate(units) if u.tied_user] if tied_elems else []
    # unsharded gradient bytes of each gathering unit: parameters first used there, tied ones apart
    grads = {i: u.own_grad_bytes for i, u in enumerate(units) if u.dp.gathers}
    tied_accumulated = tied if accumulating and any(units[i].dp.gathers for i in tied_users) else 0.0
    accumulated = sum(grads.values()) + tied_accumulated if accumulating else 0.0
    all_gathered = sum(w.gathered.values())
    still_gathered = pipelined and accumulating  # later micro-batches find every unit's weights gathered
    for first in (True, False) if accumulating or later else (True,):  # the first micro-batch's forward, a later one's
        acc = 0.0 if first else accumulated + all_made
        for i, u in enumerate(units):  # forward: every unit's busiest moment, with its saved tensors
            fixed = acc + w.root_params + (all_gathered if still_gathered and not first else w.weights_in_forward(i))
            extra = u.forward_transient
            if u.loss_loop is not None:
                extra = max(extra, loop_peak(u.loss_loop, u.dp, u.gathered_bytes, u.unsharded_grad_bytes,
                                             created_grads[i] if created_grads is not None else 0.0))
            w.moment(w.held_before[i] + u.act_bytes + fixed + extra, fixed + extra)
            if i in w.gathered and u.dp.gather_buffer and (first or not still_gathered):
                # the block's all-gather: its output buffer and the previous one's, besides the copy
                earlier = [j for j in w.blocks if j < i]
                previous = w.gathered[earlier[-1]] if earlier else w.root_params
                fixed = acc + w.root_params + w.kept_before[i] + 2 * w.gathered[i] + previous
                w.moment(w.held_before[i] + fixed, fixed)
    if accumulating:  # a micro-batch before the last: nothing reduced, every unsharded gradient alive
        for i in reversed(range(len(units))):
            u = units[i]
            prof = u.profile
            fixed = accumulated + w.root_params + (all_gathered if still_gathered else w.weights_in_backward(i))
            w.moment(w.held_before[i] + fixed + all_made + prof.peak, fixed + prof.transient_peak)
    # the last (or only) micro-batch: gradients reduced block by block
    root_grads = reduce_buffer = pending_tied = 0.0
    for i in reversed(range(len(units))):
        u = units[i]
        prof = u.profile
        # pipelined: the blocks not reached yet are still gathered from the earlier micro-batches
        weights = sum(g for j, g in w.gathered.items() if j <= i) if still_gathered else w.weights_in_backward(i)
        if accumulating:  # gradients accumulated earlier, not reduced yet: outside the blocks, and blocks up to i
            root_grads = tied_accumulated + sum(g for j, g in grads.items() if j not in w.gathered or j <= i)
        fixed = w.root_params + root_grads + weights + reduce_buffer + pending_tied
        own, transient = ((prof.peak_unsharded, prof.transient_peak_unsharded) if u.dp.gathers and not accumulating
                          else (prof.peak, prof.transient_peak))
        w.moment(w.held_before[i] + fixed + made_by(i) + own, fixed + transient)
        if i in w.gathered:
            # end of the block's backward: its weights freed, the older buffers released, its
            # gradients copied into new reduce buffers
            unsharded = u.unsharded_grad_bytes
            reduce_buffer = u.dp.reduce_buffers * unsharded
            fixed = w.root_params + root_grads + weights - w.gathered[i] + reduce_buffer + pending_tied + (
                0.0 if accumulating else unsharded)
            w.moment(w.held_before[i] + fixed + made_by(i, including=True), fixed)
        elif i in grads and not accumulating:  # outside the blocks: unsharded to the end of backward
            # (but a chunked loss's weight gradient, reduced inside forward)
            looped = u.loss_loop.weight_elems * prec.grad_bytes if u.loss_loop is not None else 0.0
            root_grads += max(0.0, grads[i] - looped)
        if tied_users and i == tied_users[-1] and len(tied_users) > 1:
            pending_tied = tied  # the head's gradient of the tied table waits for the embedding's
        if tied_users and i == tied_users[0]:
            # the first user's own gradient of the table, the one waiting, and their sum
            fixed = w.root_params + root_grads + weights + reduce_buffer + pending_tied + tied
            w.moment(w.held_before[i] + fixed + made_by(i) + tied_workspace_elems * prec.grad_bytes,
                     fixed + tied_workspace_elems * prec.grad_bytes)
            pending_tied = 0.0
    return StagePeak(w.total, w.temp)


class _Walk:
    """What the stage holds besides resident states: saved tensors before each unit, gathered
    weights, and the largest moment seen (``total``) and its temporaries' peak (``temp``)."""

    def __init__(self, units: Sequence[StageUnit], shared_act_bytes: float) -> None:
        self.units = units
        self.gathered = {i: u.gathered_bytes for i, u in enumerate(units) if u.is_block and u.dp.gathers}
        self.blocks = list(self.gathered)
        # copies blocks keep from forward, alive when block i's backward starts (its own excluded)
        self.kept_before: dict[int, float] = {}
        running = 0.0
        for i in self.blocks:
            self.kept_before[i] = running
            if units[i].dp.kept_from_forward:
                running += self.gathered[i]
        # the weights of gathering units outside the blocks, gathered for the whole step
        self.root_params = sum(u.own_param_bytes for u in units if not u.is_block and u.dp.gathers)
        self.held_before = [shared_act_bytes]  # saved tensors of the units before each one
        for u in units[:-1]:
            self.held_before.append(self.held_before[-1] + u.act_bytes)
        self.total = self.temp = 0.0

    def moment(self, total: float, temporary: float) -> None:
        """A moment holding ``total`` bytes above the resident states, ``temporary`` of them buffers."""
        self.total = max(self.total, total)
        self.temp = max(self.temp, temporary)

    def weights_in_forward(self, i: int) -> float:
        return _weights_in_forward(i, self.blocks, self.gathered, self.kept_before, self.units)

    def weights_in_backward(self, i: int) -> float:
        return _weights_alive(i, self.blocks, self.gathered, self.kept_before, self.units)


def _weights_in_forward(i: int, blocks: list[int], gathered: dict[int, float], kept_before: dict[int, float],
                        units: Sequence[StageUnit]) -> float:
    """Gathered weights alive while unit ``i``'s forward runs: the copies blocks up to it keep from
    forward (its own included), and the all-gather output buffer of the last block gathered (with
    that block's weights, when it is the unit running)."""
    before = [j for j in blocks if j <= i]
    if not before:
        return 0.0
    last = before[-1]
    own = gathered[last] if last == i or units[last].dp.kept_from_forward else 0.0
    buffer = gathered[last] if units[last].dp.gather_buffer else 0.0
    return kept_before[last] + own + buffer


def _weights_alive(i: int, blocks: list[int], gathered: dict[int, float], kept_before: dict[int, float],
                   units: Sequence[StageUnit]) -> float:
    """Gathered weights alive while unit ``i``'s backward runs: its own (a block), the copies
    earlier blocks keep from forward, and the block prefetched next (or, for a unit after the
    blocks, the last block's weights, still gathered from forward)."""
    if i in gathered:
        earlier = [j for j in blocks if j < i]
        prefetched = gathered[earlier[-1]] if earlier and not units[earlier[-1]].dp.kept_from_forward else 0.0
        return gathered[i] + kept_before[i] + prefetched
    before = [j for j in blocks if j < i]
    if not before:
        return 0.0
    last = before[-1]
    return gathered[last] + kept_before[last]



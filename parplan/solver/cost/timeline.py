"""The step's memory timeline, written once: which buffers a pipeline stage holds at each moment of
one micro-batch's forward and backward, above the resident model states and the other in-flight
micro-batches' activations.

The walk follows a stage's units in forward order, then backward, last unit first. It is generic
over the quantity it adds up (:class:`Algebra`): bytes for the whole-plan evaluator
(:mod:`.peak`, the busiest moment of a plan) and linear expressions of the operators' strategies
for the ILP (:mod:`parplan.solver.ilp.moments`, one constraint per moment). A unit gives the walk
its own figures: its saved tensors, its gathered weights and gradients, and its inner moments
(forward and backward), as one moment per unit for numbers (their largest) or one per operator for
linear expressions. At each moment the stage holds, besides those:

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
  of backward for the embedding's own; at the embedding's backward both and their sum coexist;
- with gradient accumulation that keeps gathering units' gradients unsharded (``accumulating``),
  every micro-batch but the first finds all of them, and under pipelining (``pipelined``) every
  block's weights still gathered; where the runtime frees gradients between steps
  (``created_grads``), a unit's appear when its backward ends.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from parplan.solver.cost.runtime import DataParallelBuffers
from parplan.solver.ir import Node

Q = TypeVar("Q")


class Algebra(Protocol[Q]):
    """How the walk adds up its quantity."""

    def zero(self) -> Q:
        """Nothing held."""

    def add(self, a: Q, b: Q, k: float = 1.0) -> Q:
        """``a + k·b``, a new value."""


class Numbers:
    """:class:`Algebra` of bytes."""

    def zero(self) -> float:
        return 0.0

    def add(self, a: float, b: float, k: float = 1.0) -> float:
        return a + b if k == 1.0 else a + k * b


NUMBERS = Numbers()


@dataclass(frozen=True)
class StepUnit(Generic[Q]):
    """One unit of the stage as the walk sees it (per device). ``forward()``: what its forward holds
    besides its saved tensors, at each of its inner moments. ``backward(unsharded)``: (held, of it
    temporary) at each inner moment of its backward: its saved tensors not freed yet and the running
    operator's gradients; with ``unsharded``, its weight gradients made so far too."""

    is_block: bool
    dp: DataParallelBuffers
    tied_user: bool  # it reads a parameter another unit of the stage reads
    act: Q  # saved for backward (the stage's shared buffers apart)
    gathered: Q  # every weight it uses, unsharded (what gathering holds)
    #: every weight's gradient, unsharded (what its reduction copies)
    unsharded_grads: Q
    own_params: Q  # weights of the parameters first used here (a stage's shared ones once)
    #: their gradients, a tied table's apart
    own_grads: Q
    kept_grads: Q  # of those, what a unit outside the blocks keeps unsharded to the end of backward
    forward: Callable[[], Sequence[Q]] = field(repr=False)
    backward: Callable[[bool], Sequence[tuple[Q, Q]]] = field(repr=False)


@dataclass(frozen=True)
class Moment(Generic[Q]):
    """One moment of the step: ``held + fixed + own`` above the resident states, ``fixed + own_temp``
    of it temporaries (gathered weights, gradients, buffers)."""

    unit: int  # the unit running
    kind: str  # forward, gather, backward, block end, tied
    held: Q  # saved tensors and resident gradients made so far
    fixed: Q  # the stage's buffers around the unit
    own: Q  # the unit's own inner moment
    own_temp: Q  # of it temporary

    def total(self, alg: Algebra[Q]) -> Q:
        return alg.add(alg.add(self.held, self.fixed), self.own)

    def temporaries(self, alg: Algebra[Q]) -> Q:
        return alg.add(self.fixed, self.own_temp)


def total(alg: Algebra[Q], parts: Iterable[Q]) -> Q:
    out = alg.zero()
    for p in parts:
        out = alg.add(out, p)
    return out


@dataclass(frozen=True)
class Tied(Generic[Q]):
    """Parameters two units of the stage use (a tied embedding)."""

    grads: Q  # their local gradient
    workspace: Q  # the gradient the first user's backward makes for them
    accumulated: Q  # what accumulation keeps of their gradient (where a unit reading them gathers)


@dataclass(frozen=True)
class StepOptions(Generic[Q]):
    """How the step runs (see :func:`step_moments`)."""

    accumulating: bool = False
    pipelined: bool = False
    created_grads: Sequence[Q] | None = None
    shared_grads: Q | None = None
    later_microbatches: bool = False
    #: the created gradients are freed when the micro-batch's backward ends (temporaries)
    transient_grads: bool = False


def step_moments(alg: Algebra[Q], units: Sequence[StepUnit[Q]], shared_act: Q, tied: Tied[Q] | None = None,
                 options: StepOptions[Q] | None = None, keep: Container[int] | None = None) -> Iterator[Moment[Q]]:
    """Every moment of one micro-batch's forward and backward through ``units`` (forward order).

    ``shared_act``: saved tensors several units share, freed only at the end; ``tied``: parameters
    two units use (a tied embedding);
    ``keep``: only the moments of these units (the others' inner moments are not asked for).

    ``options.accumulating``: the step accumulates gradients over several micro-batches, and
    gathering units keep their unsharded gradients from the first micro-batch's backward until the
    last's (FSDP2 without gradient synchronisation), so every micro-batch but the first sees all of
    them; ``options.pipelined``: with that, gathering units also keep their weights gathered from
    their first backward until the last (``torch.distributed.pipelining`` turns resharding after
    backward off for every micro-batch but the last), so later micro-batches gather nothing.
    ``options.created_grads``: the resident gradients of each unit when the runtime frees gradients
    between steps: a unit's appear when its backward ends, and ``options.shared_grads`` (parameters
    several units share) from the start of backward; every micro-batch after the first
    (``options.later_microbatches``) finds all of them; with ``options.transient_grads`` they are
    made anew by every micro-batch and freed when its backward ends (nanotron's compute-type
    gradients, added into its fp32 buffer): temporaries, as gradients being made are."""
    o = options or StepOptions()
    w = _Walk(alg, units, shared_act, o)
    w.set_tied(tied)
    yield from w.forward(keep)
    if o.accumulating:
        yield from w.earlier_backward(keep)
    yield from w.last_backward(tied, keep)


def kept_between_microbatches(alg: Algebra[Q], units: Sequence[StepUnit[Q]], tied: Tied[Q] | None,
                              options: StepOptions[Q]) -> tuple[Q, Q]:
    """(weights, gradients) ``units`` keep unsharded between their micro-batches, from their first
    forward (weights) or first backward (gradients) to their last backward: under pipelining with
    accumulation every gathering unit's weights (FSDP2 without resharding, as ``torch.distributed.
    pipelining`` runs every backward but a stage's last) and its accumulated unsharded gradients;
    nothing otherwise. What another chunk of the same device holds while one runs (interleaved)."""
    w = _Walk(alg, units, alg.zero(), options)
    w.set_tied(tied)
    weights = alg.add(w.root_params, w.all_gathered) if w.still_gathered else alg.zero()
    return weights, w.accumulated


class _Walk(Generic[Q]):
    """The walk's running state: saved tensors before each unit, gathered weights, made gradients."""

    def __init__(self, alg: Algebra[Q], units: Sequence[StepUnit[Q]], shared_act: Q, o: StepOptions[Q]) -> None:
        self.alg, self.units, self.o = alg, units, o
        add, zero = alg.add, alg.zero()
        self.zero = zero
        self.gathered = {i: u.gathered for i, u in enumerate(units) if u.is_block and u.dp.gathers}
        self.blocks = list(self.gathered)
        # copies blocks keep from forward, alive when block i's backward starts (its own excluded)
        self.kept_before: dict[int, Q] = {}
        running = zero
        for i in self.blocks:
            self.kept_before[i] = running
            if units[i].dp.kept_from_forward:
                running = add(running, self.gathered[i])
        # the weights of gathering units outside the blocks, gathered for the whole step
        self.root_params = total(alg, (u.own_params for u in units if not u.is_block and u.dp.gathers))
        self.held_before = [shared_act]  # saved tensors of the units before each one
        for u in units[:-1]:
            self.held_before.append(add(self.held_before[-1], u.act))
        # after[i]: gradients made by the units after i (none when none are made in backward)
        self.later = o.later_microbatches and o.created_grads is not None
        self.after = [zero] * (len(units) + 1)
        if o.created_grads is not None:
            for i in reversed(range(len(units))):
                self.after[i] = add(self.after[i + 1], o.created_grads[i])
        self.shared_grads = zero if o.shared_grads is None else o.shared_grads
        self.all_made = add(self.after[0], self.shared_grads)
        # unsharded gradients of each gathering unit: parameters first used there, tied ones apart
        self.grads = {i: u.own_grads for i, u in enumerate(units) if u.dp.gathers}
        self.still_gathered = o.pipelined and o.accumulating  # later micro-batches find every block gathered
        self.all_gathered = total(alg, self.gathered.values()) if self.still_gathered else zero
        self.tied_accumulated = zero
        self.accumulated = zero

    def made_by(self, i: int, including: bool = False) -> Q:
        """Gradients alive in the last micro-batch's backward at unit ``i`` (units after it done)."""
        if self.o.accumulating or self.later:
            return self.all_made
        return self.alg.add(self.shared_grads, self.after[i if including else i + 1])

    def with_made(self, i: int, fixed: Q, including: bool = False) -> tuple[Q, Q]:
        """(held, fixed) at unit ``i`` of the last backward: the saved tensors before it, and the
        gradients made so far (:meth:`made_by`) with the held ones, or with the temporaries when
        they are transient."""
        made = self.made_by(i, including)
        if self.o.transient_grads:
            return self.held_before[i], self.alg.add(fixed, made)
        return self.alg.add(self.held_before[i], made), fixed

    def forward(self, keep: Container[int] | None) -> Iterator[Moment[Q]]:
        """Every unit's forward moments, with its saved tensors; a gathering block's all-gather."""
        add, zero = self.alg.add, self.zero
        o = self.o
        for first in (True, False) if o.accumulating or self.later else (True,):  # the first micro-batch, a later one
            acc = zero if first else add(self.accumulated, self.all_made)
            for i, u in enumerate(self.units):
                if keep is not None and i not in keep:
                    continue
                weights = self.all_gathered if self.still_gathered and not first else self.weights_in_forward(i)
                fixed = add(add(acc, self.root_params), weights)
                before = add(self.held_before[i], u.act)
                for extra in u.forward():
                    yield Moment(i, "forward", before, fixed, extra, extra)
                if i in self.gathered and u.dp.gather_buffer and (first or not self.still_gathered):
                    # the block's all-gather: its output buffer and the previous one's, besides the copy
                    earlier = [j for j in self.blocks if j < i]
                    previous = self.gathered[earlier[-1]] if earlier else self.root_params
                    fixed = add(add(add(add(acc, self.root_params), self.kept_before[i]), self.gathered[i], 2.0),
                                previous)
                    yield Moment(i, "gather", self.held_before[i], fixed, zero, zero)

    def set_tied(self, tied: Tied[Q] | None) -> None:
        """What accumulation keeps: every gathering unit's gradients (and a tied table's)."""
        if not self.o.accumulating:
            return
        if tied is not None:
            self.tied_accumulated = tied.accumulated
        self.accumulated = self.alg.add(total(self.alg, self.grads.values()), self.tied_accumulated)

    def earlier_backward(self, keep: Container[int] | None) -> Iterator[Moment[Q]]:
        """A micro-batch before the last: nothing reduced, every unsharded gradient alive."""
        add = self.alg.add
        for i in reversed(range(len(self.units))):
            if keep is not None and i not in keep:
                continue
            weights = self.all_gathered if self.still_gathered else self.weights_in_backward(i)
            fixed = add(add(self.accumulated, self.root_params), weights)
            held = add(self.held_before[i], self.all_made)
            for own, transient in self.units[i].backward(False):
                yield Moment(i, "backward", held, fixed, own, transient)

    def last_backward(self, tied: Tied[Q] | None, keep: Container[int] | None) -> Iterator[Moment[Q]]:
        """The last (or only) micro-batch: gradients reduced block by block."""
        add, zero, units = self.alg.add, self.zero, self.units
        accumulating = self.o.accumulating
        tied_users = [i for i, u in enumerate(units) if u.tied_user] if tied is not None else []
        root_grads = reduce_buffer = pending = zero
        for i in reversed(range(len(units))):
            u = units[i]
            want = keep is None or i in keep
            # pipelined: the blocks not reached yet are still gathered from the earlier micro-batches
            weights = (total(self.alg, (g for j, g in self.gathered.items() if j <= i)) if self.still_gathered
                       else self.weights_in_backward(i))
            if accumulating:  # gradients accumulated earlier, not reduced yet: outside the blocks, and blocks up to i
                root_grads = add(self.tied_accumulated, total(self.alg, (
                    g for j, g in self.grads.items() if j not in self.gathered or j <= i)))
            fixed = add(add(add(add(self.root_params, root_grads), weights), reduce_buffer), pending)
            if want:
                held, fixed = self.with_made(i, fixed)
                for own, transient in u.backward(u.dp.gathers and not accumulating):
                    yield Moment(i, "backward", held, fixed, own, transient)
            if i in self.gathered:
                # end of the block's backward: its weights freed, the older buffers released, its
                # gradients copied into new reduce buffers
                reduce_buffer = add(zero, u.unsharded_grads, float(u.dp.reduce_buffers))
                if want:
                    end = add(add(add(add(add(self.root_params, root_grads), weights), self.gathered[i], -1.0),
                                  reduce_buffer), pending)
                    if not accumulating:
                        end = add(end, u.unsharded_grads)
                    yield Moment(i, "block end", *self.with_made(i, end, including=True), zero, zero)
            elif i in self.grads and not accumulating:  # outside the blocks: unsharded to the end of backward
                root_grads = add(root_grads, u.kept_grads)
            if tied is not None and tied_users and i == tied_users[-1] and len(tied_users) > 1:
                pending = tied.grads  # the head's gradient of the tied table waits for the embedding's
            if tied is not None and tied_users and i == tied_users[0]:
                if want:  # the first user's own gradient of the table, the one waiting, and their sum
                    both = add(add(add(add(add(self.root_params, root_grads), weights), reduce_buffer), pending),
                               tied.grads)
                    yield Moment(i, "tied", *self.with_made(i, add(both, tied.workspace)), zero, zero)
                pending = zero

    def weights_in_forward(self, i: int) -> Q:
        """Gathered weights alive while unit ``i``'s forward runs: the copies blocks up to it keep
        from forward (its own included), and the all-gather output buffer of the last block gathered
        (with that block's weights, when it is the unit running)."""
        before = [j for j in self.blocks if j <= i]
        if not before:
            return self.zero
        last = before[-1]
        out = self.kept_before[last]
        if last == i or self.units[last].dp.kept_from_forward:
            out = self.alg.add(out, self.gathered[last])
        if self.units[last].dp.gather_buffer:
            out = self.alg.add(out, self.gathered[last])
        return out

    def weights_in_backward(self, i: int) -> Q:
        """Gathered weights alive while unit ``i``'s backward runs: its own (a block), the copies
        earlier blocks keep from forward, and the block prefetched next (or, for a unit after the
        blocks, the last block's weights, still gathered from forward)."""
        add = self.alg.add
        if i in self.gathered:
            earlier = [j for j in self.blocks if j < i]
            out = add(self.gathered[i], self.kept_before[i])
            if earlier and not self.units[earlier[-1]].dp.kept_from_forward:
                out = add(out, self.gathered[earlier[-1]])  # prefetched
            return out
        before = [j for j in self.blocks if j < i]
        if not before:
            return self.zero
        return add(self.gathered[before[-1]], self.kept_before[before[-1]])


def forward_live(alg: Algebra[Q], nodes: Sequence[Node], consumers: Mapping[str, Sequence[str]],
                 live_size: Callable[[Node], Q | None], around: Callable[[Node], Q]) -> Iterator[Q]:
    """What a unit's forward holds besides its saved tensors at each of its operators (forward order):
    the unsaved tensors made so far and still to be read (``live_size``: a tensor's bytes, None for
    one that costs nothing here: saved, a view), and ``around`` the operator (its buffers). A tensor
    read by another unit stays to the end of the unit."""
    local = {n.id for n in nodes}
    remaining = {n.id: len(consumers[n.id]) if all(c in local for c in consumers[n.id]) else -1 for n in nodes}
    live: dict[str, Q] = {}
    for n in nodes:
        size = live_size(n)
        if size is not None:
            live[n.id] = size
        yield alg.add(total(alg, live.values()), around(n))
        for i in dict.fromkeys(n.inputs):
            if i in remaining and remaining[i] > 0:
                remaining[i] -= 1
                if remaining[i] == 0:
                    live.pop(i, None)

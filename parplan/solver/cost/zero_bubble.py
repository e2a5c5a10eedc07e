"""Zero-bubble pipeline schedules (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): each
backward runs as B (the input gradient, sent on at once) and W (the weight gradient, run later to
fill the bubbles), as PyTorch's ``torch.distributed.pipelining`` runs them.

*Order.* What each rank runs, in PyTorch's order (torch/distributed/pipelining/schedules.py):

- ``interleaved-zb`` (``ScheduleInterleavedZeroBubble``, ``v`` chunks per rank, chunk ``k`` of rank
  ``i`` being virtual stage ``i + k·p``): micro-batches go in rounds of ``m // max(1, m // p)``; rank
  ``i`` warms up with ``(v − 1)·round + p − 1 − i`` forwards, then runs one forward and one B, and
  from its ``i``-th B on one W after each, the oldest first; the Ws left over end the step;
- ``zbv`` (``ScheduleZBVZeroBubble``): two chunks per rank in a V, rank ``i`` holding virtual stages
  ``i`` (chunk 0) and ``2p − 1 − i`` (chunk 1), so the first and the last stage (embedding, loss)
  share rank 0; its warm-up, steady F-B-W pairs of both chunks and cool-down, as the class builds them.

*Memory.* ``stage_backward_input`` keeps the autograd graph (``retain_graph=True``) for W, so a
micro-batch's activations of a chunk live from its forward to the end of its W. Counting over the
orders (checked against PyTorch's own order generation in the tests), the most (chunk, micro-batch)
pairs alive on rank ``i`` is ``min((v − 1)·round + p, m·v)`` under ``interleaved-zb`` (the same on
every rank: ZB-H1 holds ``p`` micro-batches everywhere, 1F1B's first stage's) and
``min(2p, m + 1 + i, 2m)`` chunks under ``zbv`` (``p`` micro-batches of the rank's layers at
``m ≥ 2p − 1``).

*Time.* With a device's per-micro-batch forward ``F``, weight-gradient ``W`` (its weight GEMMs'
gradient, :attr:`~.units.UnitCost.weight_grad_seconds`) and the rest ``B``, ``interleaved-zb``
leaves a bubble of ``(p − 1)(F + B − W)/v`` (the paper's ZB-H1, §3.1, divided over the chunks; 1F1B's
is ``(p − 1)(F + B + W)``); ``zbv``'s depends on the three times apart (PyTorch's V is not the
paper's greedy ZB-V), so its step is the makespan of the ranks' orders, list-scheduled.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from parplan.solver.errors import StrategyError
from parplan.solver.strategy import Schedule

#: One action of a rank: ("F" | "I" | "W", its local chunk).
Action = tuple[str, int]


def interleaved_zb_rank_order(pp: int, v: int, m: int, rank: int) -> list[Action]:
    """What ``rank`` runs under ``interleaved-zb`` (module docstring), in order."""
    if not 0 <= rank < pp:
        raise StrategyError(f"rank {rank} out of range for pp={pp}")
    per_round = m // max(1, m // pp)
    total = m * v
    warmup = min((v - 1) * per_round + pp - 1 - rank, total)

    def backward_chunk(step: int) -> int:
        return v - 1 - ((step - warmup) // per_round) % v

    order: list[Action] = [("F", (k // per_round) % v) for k in range(warmup)]
    pending: list[int] = []  # chunks of the Bs whose W has not run, oldest first
    for k in range(warmup, total + warmup):
        if k < total:
            order.append(("F", (k // per_round) % v))
        order.append(("I", backward_chunk(k)))
        pending.append(backward_chunk(k))
        if k - warmup >= rank:
            order.append(("W", pending.pop(0)))
    order += [("W", c) for c in pending]
    return order


def zbv_rank_order(pp: int, m: int, rank: int) -> list[Action]:
    """What ``rank`` runs under ``zbv`` (module docstring), in order: PyTorch's phases, built for
    ``max(2p − 1, m)`` micro-batches and the ones past ``m`` dropped."""
    if not 0 <= rank < pp:
        raise StrategyError(f"rank {rank} out of range for pp={pp}")
    n = max(2 * pp - 1, m)
    out: list[tuple[str, int, int]] = []
    count = {(kind, c): 0 for kind in "FIW" for c in (0, 1)}

    def act(*actions: str) -> None:
        for a in actions:
            kind, c = a[0], int(a[1])
            out.append((kind, c, count[kind, c]))
            count[kind, c] += 1

    for _ in range(2 * (pp - rank) - 1):
        act("F0")
    for _ in range(rank):
        act("F1", "F0")
    for _ in range(pp - rank):
        act("F1", "I1", "W1")
    while count["F", 1] < count["F", 0] or count["F", 0] < n:
        if count["F", 0] < n:
            act("F0")
        act("I0", "W0", "F1", "I1", "W1")
    for _ in range(rank):
        act("I0", "I1")
    for _ in range(pp - rank):
        act("I0", "W0")
    while count["W", 1] < count["I", 1]:
        act("W1")
    while count["W", 0] < count["I", 0]:
        act("W0")
    return [(kind, c) for kind, c, mb in out if mb < m]


def dualpipev_rank_order(pp: int, m: int, rank: int) -> list[Action]:
    """What ``rank`` runs under ``dualpipev`` (PyTorch's ``ScheduleDualPipeV``, DeepSeek-V3's
    DualPipe on a V), in order: besides F, I and W, ("B", k) a whole backward and ("O", k) a
    forward of chunk ``k`` overlapped with a whole backward of the other chunk; a W runs the oldest
    pending input gradient's."""
    if not 0 <= rank < pp:
        raise StrategyError(f"rank {rank} out of range for pp={pp}")
    out: list[Action] = []
    pending: list[int] = []

    def act(kind: str, c: int) -> None:
        out.append((kind, c))
        if kind == "I":
            pending.append(c)

    def weight() -> None:
        if pending:
            out.append(("W", pending.pop(0)))

    out += [("F", 0)] * (2 * (pp - rank - 1))
    out += [("F", 0), ("F", 1)] * (rank + 1)
    for _ in range(pp - rank - 1):
        act("I", 1)
        weight()
        act("F", 1)
    for i in range(m - 2 * pp + rank + 1):
        out += [("F", 0), ("B", 1)] if i == 0 and rank == pp - 1 else [("O", 0)]
        out.append(("O", 1))
    out += [("B", 1), ("O", 1)] * (pp - rank - 1)
    split = False  # the second half of the last backwards run as I and W
    for i in range(rank + 1):
        split = split or (i == (rank + 1) // 2 and rank % 2 == 1)
        act("I" if split else "B", 1)
        split = split or (i == (rank + 1) // 2 and rank % 2 == 0)
        act("I" if split else "B", 0)
    for _ in range(pp - rank - 1):
        weight()
        act("I" if split else "B", 0)
    for _ in range(rank + 1):
        weight()
    return out


def zb_in_flight_chunks(schedule: Schedule, pp: int, v: int, m: int, rank: int) -> int:
    """The most (chunk, micro-batch) pairs alive on ``rank`` (module docstring's closed forms)."""
    if schedule is Schedule.DUALPIPEV:
        return 2 * pp + 1
    if schedule is Schedule.ZBV:
        return min(2 * pp, m + 1 + rank, 2 * m)
    return min((v - 1) * (m // max(1, m // pp)) + pp, m * v)


def interleaved_zb_bubble(forward: Sequence[float], rest: Sequence[float], weight: Sequence[float],
                          slowest: int, v: int) -> float:
    """``interleaved-zb``'s bubble from each stage's F, B and W seconds: ``(p − 1)(F + B − W)/v`` for
    equal stages, the stages but the slowest each adding their own."""
    return sum(f + b - w for s, (f, b, w) in enumerate(zip(forward, rest, weight, strict=True))
               if s != slowest) / v


#: One action of a compiled V order: its rank, the kinds whose seconds it takes (F, I, W) and the
#: indices, in the compiled list, of the other ranks' actions it waits for.
_Step = tuple[int, tuple[str, ...], tuple[int, ...]]


@functools.lru_cache(maxsize=256)
def _compiled(orders: tuple[tuple[Action, ...], ...]) -> tuple[_Step, ...]:
    """The actions of a V schedule's orders in an order where each comes after what it waits for
    (:func:`v_makespan`'s rules): the orders' structure does not depend on the seconds, so the
    makespan of any seconds is one pass over it (a longest path)."""
    pp = len(orders)
    last = 2 * pp - 1
    index: dict[tuple[str, int, int], int] = {}  # (kind, virtual stage, micro-batch) -> action
    pos = [0] * pp
    made = [dict.fromkeys(((kind, c) for kind in "FIW" for c in (0, 1)), 0) for _ in range(pp)]
    out: list[_Step] = []

    def needs(r: int, kind: str, c: int) -> tuple[str, int, int] | None:
        vs, mb = (r if c == 0 else last - r), made[r][kind, c]
        if kind == "F":
            return ("F", vs - 1, mb) if vs else None
        if kind == "I":
            return ("I", vs + 1, mb) if vs < last else ("F", vs, mb)
        return ("I", vs, mb)

    moved = True
    while moved:
        moved = False
        for r in range(pp):
            while pos[r] < len(orders[r]):
                kind, chunk = orders[r][pos[r]]
                steps = _PARTS[kind](chunk) if kind in _PARTS else [(kind, chunk)]
                deps = [d for d in (needs(r, k, c) for k, c in steps if k != "W") if d is not None]
                if any(d not in index for d in deps):
                    break
                out.append((r, tuple(k for k, _ in steps), tuple(index[d] for d in deps)))
                for k, c in steps:
                    index[k, r if c == 0 else last - r, made[r][k, c]] = len(out) - 1
                    made[r][k, c] += 1
                pos[r] += 1
                moved = True
    if any(pos[r] < len(orders[r]) for r in range(pp)):
        raise StrategyError("the pipeline order does not complete")  # not reached: PyTorch's orders run
    return tuple(out)


#: What an overlapped forward-backward ("O") and a whole backward ("B") of chunk ``c`` are made of.
_PARTS: dict[str, Callable[[int], list[tuple[str, int]]]] = {
    "O": lambda c: [("F", c), ("I", 1 - c), ("W", 1 - c)],
    "B": lambda c: [("I", c), ("W", c)],
}


def v_makespan(orders: Sequence[Sequence[Action]], forward: Sequence[float], rest: Sequence[float],
               weight: Sequence[float]) -> float:
    """Seconds until every rank has run its order of a V schedule (``zbv``, ``dualpipev``), each
    action as soon as its rank is free and its input is there (F after the previous virtual stage's
    F, I or B after the next one's or its own F on the last, W after its I; an overlapped F and B
    when both can start, taking both their times); a chunk takes half its device's F, B and W."""
    return _makespan(tuple(tuple(o) for o in orders), tuple(forward), tuple(rest), tuple(weight))


@functools.lru_cache(maxsize=4096)
def _makespan(orders: tuple[tuple[Action, ...], ...], forward: tuple[float, ...], rest: tuple[float, ...],
              weight: tuple[float, ...]) -> float:
    seconds = {"F": forward, "I": rest, "W": weight}
    end: list[float] = []
    free = [0.0] * len(orders)
    for r, kinds, deps in _compiled(orders):
        finish = max([free[r], *(end[d] for d in deps)]) + sum(seconds[k][r] / 2 for k in kinds)
        end.append(finish)
        free[r] = finish
    return max(free)


def zbv_makespan(forward: Sequence[float], rest: Sequence[float], weight: Sequence[float], m: int) -> float:
    """:func:`v_makespan` of ``zbv``'s orders."""
    return v_makespan(_zbv_orders(len(forward), m), forward, rest, weight)


@functools.lru_cache(maxsize=256)
def _zbv_orders(pp: int, m: int) -> tuple[tuple[Action, ...], ...]:
    return tuple(tuple(zbv_rank_order(pp, m, r)) for r in range(pp))


@functools.lru_cache(maxsize=256)
def dualpipev_orders(pp: int, m: int) -> tuple[tuple[Action, ...], ...]:
    """Every rank's :func:`dualpipev_rank_order`."""
    return tuple(tuple(dualpipev_rank_order(pp, m, r)) for r in range(pp))


__all__ = ["Action", "dualpipev_orders", "dualpipev_rank_order", "interleaved_zb_bubble", "interleaved_zb_rank_order",
           "v_makespan", "zb_in_flight_chunks", "zbv_makespan", "zbv_rank_order"]

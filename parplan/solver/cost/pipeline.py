"""Pipeline stages: which blocks each stage runs, and how many micro-batches it keeps alive.

In-flight micro-batches of activations on stage ``i`` of ``p`` with ``m`` micro-batches:

- GPipe: all ``m`` (every forward runs before any backward);
- 1F1B (PipeDream-Flush): ``min(p - i, m)`` — the first stage holds ``p``;
- interleaved 1F1B with ``v`` model chunks per device: device ``i`` warms up with
  ``2(p - i - 1) + (v - 1)p`` chunk-forwards, so ``(2(p - i - 1) + (v - 1)p + 1) / v`` micro-batches
  of its layers are alive at the peak; for ``i = 0`` that is ``p·(1 + (p - 1)/(p·v))``, the factor
  Narayanan et al. (2021) give. Capped at ``m``;
- the zero-bubble schedules (``interleaved-zb``, ``zbv``): a chunk's micro-batch alive from its
  forward to its weight gradient W (:mod:`.zero_bubble`'s closed forms, over the device's chunks).
"""

from __future__ import annotations

from parplan.solver.cost.activations import block_of
from parplan.solver.cost.zero_bubble import (
    Action,
    dualpipev_rank_order,
    interleaved_zb_rank_order,
    zb_in_flight_chunks,
    zbv_rank_order,
)
from parplan.solver.errors import StrategyError
from parplan.solver.ir import Graph
from parplan.solver.strategy import Schedule


def in_flight_microbatches(stage: int, pp: int, m: int, schedule: Schedule, virtual_stages: int = 1) -> float:
    """Micro-batches whose activations stage ``stage`` (0-based) holds at its peak."""
    if not 0 <= stage < pp:
        raise StrategyError(f"stage {stage} out of range for pp={pp}")
    if schedule is Schedule.GPIPE:
        return float(m)
    if schedule.zero_bubble:
        v = 2 if schedule.v_shape else virtual_stages
        return zb_in_flight_chunks(schedule, pp, v, m, stage) / v
    if schedule is Schedule.INTERLEAVED and virtual_stages > 1:
        v = virtual_stages
        chunks = 2 * (pp - stage - 1) + (v - 1) * pp + 1
        return min(float(m), chunks / v)
    return float(min(pp - stage, m))


def interleaved_rank_order(pp: int, v: int, m: int, rank: int) -> list[tuple[str, int]]:
    """What ``rank`` runs under interleaved 1F1B, in order: ("F" | "B", its local chunk), chunk
    ``k`` being virtual stage ``rank + k·pp``. PyTorch's ``ScheduleInterleaved1F1B``: micro-batches
    go in rounds of ``m // max(1, m // pp)``; a rank warms up with ``(v − 1)·round + 2(pp − 1 −
    rank)`` forwards (at most ``m·v``), then alternates one forward and one backward, then drains
    the backwards; forwards cycle the chunks round by round, backwards the other way. Megatron-LM's
    interleaved schedule takes the same order when ``m`` is a multiple of ``pp``."""
    if not 0 <= rank < pp:
        raise StrategyError(f"rank {rank} out of range for pp={pp}")
    per_round = m // max(1, m // pp)
    total = m * v
    warmup = min((v - 1) * per_round + 2 * (pp - 1 - rank), total)

    def forward_chunk(step: int) -> int:
        return (step // per_round) % v

    def backward_chunk(step: int) -> int:
        return v - 1 - ((step - warmup) // per_round) % v

    order = [("F", forward_chunk(k)) for k in range(warmup)]
    for k in range(warmup, total):
        order += [("F", forward_chunk(k)), ("B", backward_chunk(k))]
    order += [("B", backward_chunk(k)) for k in range(total, total + warmup)]
    return order


def rank_order(schedule: Schedule, pp: int, v: int, m: int, rank: int) -> list[Action]:
    """What ``rank`` runs, in order, over its local chunks: ("F", k) forwards, and ("B", k) whole
    backwards (interleaved 1F1B) or ("I", k) input gradients then ("W", k) weight gradients (the
    zero-bubble schedules), each of a chunk's micro-batches in turn; ``dualpipev``'s overlapped
    forward and backward as the forward, then the backward."""
    if schedule is Schedule.DUALPIPEV:
        out: list[Action] = []
        for kind, k in dualpipev_rank_order(pp, m, rank):
            out += [("F", k), ("B", 1 - k)] if kind == "O" else [(kind, k)]
        return out
    if schedule is Schedule.ZBV:
        return zbv_rank_order(pp, m, rank)
    if schedule is Schedule.INTERLEAVED_ZB:
        return interleaved_zb_rank_order(pp, v, m, rank)
    return interleaved_rank_order(pp, v, m, rank)


def virtual_stage_of(rank: int, chunk: int, pp: int, schedule: Schedule) -> int:
    """The virtual stage of ``rank``'s local ``chunk``: ``rank + chunk·pp`` (looped), or in a V
    ``rank`` and ``2pp − 1 − rank`` (PyTorch's ``generate_stage_to_rank_mapping(style="v")``)."""
    if schedule.v_shape:
        return rank if chunk == 0 else 2 * pp - 1 - rank
    return rank + chunk * pp


def device_of(vstage: int, pp: int, schedule: Schedule) -> int:
    """The rank that runs virtual stage ``vstage`` (:func:`virtual_stage_of`'s inverse)."""
    if schedule.v_shape and vstage >= pp:
        return 2 * pp - 1 - vstage
    return vstage % pp


def units_of(graph: Graph) -> list[str]:
    """Layer tags in execution order (``meta["units"]`` when the frontend recorded it)."""
    units = graph.meta.get("units")
    if isinstance(units, list | tuple) and units:
        return [str(u) for u in units]
    seen: dict[str, None] = {}
    for n in graph.nodes:
        seen.setdefault(n.layer or "", None)
    return list(seen)


def blocks_of(graph: Graph) -> list[str]:
    """The repeated blocks (``layers.<i>`` ...) in execution order."""
    return [u for u in units_of(graph) if _is_block(u)]


def _is_block(unit: str) -> bool:
    head, _, tail = unit.rpartition(".")
    return bool(head) and tail.isdigit()


def even_partition(num_blocks: int, pp: int) -> tuple[int, ...]:
    """Blocks per stage, as even as possible; the remainder goes to the last stages (the first
    stage already carries the embedding and the most in-flight activations)."""
    if pp > num_blocks:
        raise StrategyError(f"pp={pp} exceeds the model's {num_blocks} blocks")
    base, extra = divmod(num_blocks, pp)
    return tuple(base + (1 if i >= pp - extra else 0) for i in range(pp))


def stage_of_units(graph: Graph, pp: int, partition: tuple[int, ...] | None = None) -> dict[str, int]:
    """Stage of every unit. Blocks follow ``partition``; other units (embedding, head, a T5
    encoder's final norm) join the stage of the block before them, or of the first block."""
    units = units_of(graph)
    blocks = [u for u in units if _is_block(u)]
    if not blocks:
        return dict.fromkeys(units, 0)
    part = partition or even_partition(len(blocks), pp)
    if len(part) != pp or sum(part) != len(blocks) or min(part) < 1:
        raise StrategyError(f"partition {list(part)} must give each of the {pp} stages at least one of the "
                            f"{len(blocks)} blocks")
    block_stage: dict[str, int] = {}
    i = 0
    for s, count in enumerate(part):
        for _ in range(count):
            block_stage[blocks[i]] = s
            i += 1
    out: dict[str, int] = {}
    current = 0
    for u in units:
        if u in block_stage:
            current = block_stage[u]
        out[u] = current
    return out


__all__ = ["block_of", "blocks_of", "device_of", "even_partition", "in_flight_microbatches", "interleaved_rank_order",
           "rank_order", "stage_of_units", "units_of", "virtual_stage_of"]

"""A pipeline stage's backward under ZeRO-3 (FSDP), unit by unit: its memory peak.

Adding category peaks (every saved activation + the largest temporary) over-predicts ZeRO-3 by
10–20% (the validation agent's FSDP2 runs, bench/RESULTS.md G9): its temporaries are whole
blocks' weights and gradients, and they peak in backward after part of the activations is
freed. This walk follows what FSDP2 (``fully_shard`` per block and on the root) holds while one
micro-batch's backward runs through the stage, last unit first:

- the root's parameters (units that are not blocks: embedding, head) stay gathered from forward
  to the end of backward, and their unsharded gradients accumulate until then;
- a block's backward runs with its own weights gathered and the next block's (in backward order)
  prefetched; the last block's weights are still gathered from forward;
- when a block's backward ends, its weights are freed, the previous reduce-scatter buffer is
  released (one in flight), and its unsharded gradients are copied into a reduce-scatter buffer
  of the same size, which stays until the next block ends;
- inside a unit, saved tensors are freed operator by operator (:mod:`.backward`).

Bytes per device. The caller adds the resident model states and the other micro-batches in flight.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from parplan.solver.cost.precision import Precision
from parplan.solver.cost.units import GraphCosts, UnitCost, UnitStrategy, unit_layout
from parplan.solver.ir import Node


@dataclass(frozen=True)
class StageUnit:
    """One unit of the stage, in forward order, with what its strategy makes of it."""

    name: str
    costs: GraphCosts  # built for this unit's local batch
    strategy: UnitStrategy
    cost: UnitCost
    zero3: bool
    is_block: bool


@dataclass(frozen=True)
class StagePeak:
    above_resident: float  # one micro-batch's saved tensors + every temporary, at the stage's peak
    temporary: float  # the temporaries' own peak (gathered weights, unsharded gradients, buffers)


def zero3_backward_peak(units: Sequence[StageUnit], prec: Precision, shared_act_bytes: float) -> StagePeak:
    """Peak of one micro-batch's backward through ``units`` (forward order); ``shared_act_bytes``:
    saved tensors several units share, freed only at the end."""
    blocks = [i for i, u in enumerate(units) if u.is_block and u.zero3]
    previous = {i: blocks[k - 1] for k, i in enumerate(blocks) if k > 0}  # the block before, in forward order
    gathered = {i: units[i].cost.param_elems_all * prec.param_bytes for i in blocks}
    unsharded = {i: units[i].cost.param_elems_all * prec.grad_bytes for i in blocks}
    root_params = _root_param_elems(units)
    held_before = [shared_act_bytes]  # saved tensors of the units before each one
    for u in units[:-1]:
        held_before.append(held_before[-1] + u.cost.act_bytes)
    root_grads = reduce_buffer = total = temp = 0.0
    seen_root_grads: set[str] = set()
    for i in reversed(range(len(units))):
        u = units[i]
        prof = u.costs.backward_profile(u.name, u.strategy, prec)
        prefetched = gathered[previous[i]] if i in previous else 0.0
        if i in gathered:
            weights = gathered[i] + prefetched
        else:
            # units after the last block run while its weights are still gathered from forward
            weights = gathered[blocks[-1]] if blocks and i > blocks[-1] else 0.0
        fixed = root_params * prec.param_bytes + root_grads + weights + reduce_buffer
        own, transient = ((prof.peak_unsharded, prof.transient_peak_unsharded) if u.zero3
                          else (prof.peak, prof.transient_peak))
        total = max(total, held_before[i] + fixed + own)
        temp = max(temp, fixed + transient)
        if i in gathered:
            # end of the block's backward: its weights freed, the older buffer released, its
            # gradients copied into a new reduce-scatter buffer
            fixed = root_params * prec.param_bytes + root_grads + prefetched + 2 * unsharded[i]
            total = max(total, held_before[i] + fixed)
            temp = max(temp, fixed)
            reduce_buffer = unsharded[i]
        elif u.zero3:
            for p in u.costs.params[u.name]:
                if p.id not in seen_root_grads:
                    seen_root_grads.add(p.id)
                    root_grads += p.numel * prec.grad_bytes / _shards(p, u.strategy)
    return StagePeak(total, temp)


def _root_param_elems(units: Sequence[StageUnit]) -> float:
    """Local elements of the parameters of ZeRO-3 units that are not blocks, each once."""
    seen: set[str] = set()
    total = 0.0
    for u in units:
        if u.is_block or not u.zero3:
            continue
        for p in u.costs.params[u.name]:
            if p.id not in seen:
                seen.add(p.id)
                total += p.numel / _shards(p, u.strategy)
    return total


def _shards(p: Node, s: UnitStrategy) -> int:
    return unit_layout(p, s).shards({"tp": s.tp, "ep": s.ep})

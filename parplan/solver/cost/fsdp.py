"""A pipeline stage's backward under ZeRO-3 (FSDP) or PyTorch's ``replicate``, unit by unit: its
memory peak.

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

PyTorch's ``replicate`` (its data parallelism for tensor-parallel modules) is FSDP2 over a shard
group of one: the same walk, except that the unsharded copy of every unit's weights made in
forward is kept until that unit's backward ends (all of them at the start of backward).

Bytes per device. The caller adds the resident model states and the other micro-batches in flight.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from parplan.solver.cost.precision import Precision
from parplan.solver.cost.unit_strategy import UnitStrategy, local_elems
from parplan.solver.cost.units import GraphCosts, UnitCost


@dataclass(frozen=True)
class StageUnit:
    """One unit of the stage, in forward order, with what its strategy makes of it."""

    name: str
    costs: GraphCosts  # built for this unit's local batch
    strategy: UnitStrategy
    cost: UnitCost
    zero3: bool
    is_block: bool
    #: PyTorch's ``replicate`` (FSDP2 over a shard group of one): an unsharded copy of the weights
    #: made in forward is kept until the unit's backward ends (see Runtime.keeps_parameter_copy)
    replicated: bool = False


@dataclass(frozen=True)
class StagePeak:
    above_resident: float  # one micro-batch's saved tensors + every temporary, at the stage's peak
    temporary: float  # the temporaries' own peak (gathered weights, unsharded gradients, buffers)


def fsdp_backward_peak(units: Sequence[StageUnit], prec: Precision, shared_act_bytes: float) -> StagePeak:
    """Peak of one micro-batch's backward through ``units`` (forward order); ``shared_act_bytes``:
    saved tensors several units share, freed only at the end."""
    blocks = [i for i, u in enumerate(units) if u.is_block and (u.zero3 or u.replicated)]
    previous = {i: blocks[k - 1] for k, i in enumerate(blocks) if k > 0}  # the block before, in forward order
    gathered = {i: units[i].cost.param_elems_all * prec.param_bytes for i in blocks}
    # weights gathered (or copied) while a block's backward runs, and once it has ended
    kept_before: dict[int, float] = {}
    running = 0.0
    for i in blocks:
        kept_before[i] = running if units[i].replicated else gathered.get(previous.get(i, -1), 0.0)
        running += gathered[i]
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
        prefetched = kept_before.get(i, 0.0)  # ZeRO-3: the prefetched block; replicate: every earlier copy
        if i in gathered:
            weights = gathered[i] + prefetched
        elif blocks and i > blocks[-1]:
            # units after the last block run while its weights are still gathered from forward
            # (replicate: every block's copy)
            last = blocks[-1]
            weights = gathered[last] + (kept_before[last] if units[last].replicated else 0.0)
        else:
            weights = 0.0
        fixed = root_params * prec.param_bytes + root_grads + weights + reduce_buffer
        unsharded_grads = u.zero3 or u.replicated
        own, transient = ((prof.peak_unsharded, prof.transient_peak_unsharded) if unsharded_grads
                          else (prof.peak, prof.transient_peak))
        total = max(total, held_before[i] + fixed + own)
        temp = max(temp, fixed + transient)
        if i in gathered:
            # end of the block's backward: its weights freed, the older buffer released, its
            # gradients copied into a new reduce-scatter buffer
            # (replicate: the reduce-scatter over a group of one outputs the whole gradient again,
            # and that output is all-reduced and kept as long as the input buffer)
            buffers = (2 if u.replicated else 1) * unsharded[i]
            fixed = root_params * prec.param_bytes + root_grads + prefetched + unsharded[i] + buffers
            total = max(total, held_before[i] + fixed)
            temp = max(temp, fixed)
            reduce_buffer = buffers
        elif unsharded_grads:
            for p in u.costs.params[u.name]:
                if p.id not in seen_root_grads:
                    seen_root_grads.add(p.id)
                    root_grads += local_elems(p, u.strategy) * prec.grad_bytes
    return StagePeak(total, temp)


def _root_param_elems(units: Sequence[StageUnit]) -> float:
    """Local elements of the parameters of ZeRO-3 units that are not blocks, each once."""
    seen: set[str] = set()
    total = 0.0
    for u in units:
        if u.is_block or not (u.zero3 or u.replicated):
            continue
        for p in u.costs.params[u.name]:
            if p.id not in seen:
                seen.add(p.id)
                total += local_elems(p, u.strategy)
    return total

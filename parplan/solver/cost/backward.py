"""One unit's backward pass, operator by operator: what it holds at its busiest moment.

Adding category peaks (all saved activations + the largest temporary) over-predicts: gradients,
gathered weights and buffers peak *during* backward, after part of the activations is already
freed. :mod:`.timeline` walks a stage's step unit by unit; this module gives it each unit's profile,
walking the unit's operators in reverse order:

- a saved tensor is freed after the backward of the first operator (in forward order) that
  saved it, the last of its savers that backward reaches;
- while an operator's backward runs, the gradient of its output, the gradients of its
  activation inputs and its weight gradients are alive (``transient``);
- under ZeRO-3 the unit's weight gradients stay unsharded until the unit's backward ends
  (FSDP reduce-scatters them per unit), so they accumulate.

With full recomputation a block first re-runs its forward, keeping what an uncheckpointed forward
keeps, and then walks those buffers like any other unit. Sizes are per device (the unit's tensor-
and sequence-parallel layout), bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from parplan.solver.cost.activations import (
    Recompute,
    SavedItem,
    block_of,
    is_float,
    kv_repeat,
    loss_backward_bytes_per_logit,
    op_saved_items,
    tensor_bytes,
)
from parplan.solver.cost.context_parallel import AttentionBytes, cp_buffer_bytes
from parplan.solver.cost.loss_loop import looped_nodes
from parplan.solver.cost.op_layout import input_layout, loop_dims, output_layout
from parplan.solver.cost.op_sizes import OpSizes
from parplan.solver.cost.runtime import Runtime
from parplan.solver.cost.timeline import NUMBERS, Algebra, Q, forward_live
from parplan.solver.cost.unit_strategy import (
    UnitStrategy,
    local_elems,
    op_mesh,
    uniform_strategy,
    weight_grad_workspace,
)
from parplan.solver.ir import Graph, Node, OpKind

if TYPE_CHECKING:
    from parplan.solver.cost.precision import Precision


class UnitGraph(Protocol):
    """What the walks below read of a graph's units (:class:`~parplan.solver.cost.units.GraphCosts`)."""

    graph: Graph
    nodes: dict[str, list[Node]]  # a unit's operators and graph inputs, graph order
    consumers: dict[str, list[str]]

    def saved(self, recompute: Recompute, flash: bool, act_bytes: int, runtime: Runtime = ...,
              fp8_inputs: bool = ...) -> tuple[dict[str, list[SavedItem]], set[str]]:
        """Saved items per unit, and the keys several units save."""

    def item_bytes(self, items: Iterable[SavedItem], s: UnitStrategy) -> tuple[float, float]:
        """(bytes, redundant bytes) of saved items on one device."""


@dataclass(frozen=True)
class BackwardProfile:
    """A unit's backward, relative to what the rest of the stage holds meanwhile (bytes)."""

    peak: float  # the unit's own saved tensors still alive + the running operator's gradients
    peak_unsharded: float  # the same plus the unit's weight gradients produced so far (ZeRO-3)
    transient_peak: float  # the running operator's gradients (+ what recomputation rebuilt, still alive)
    transient_peak_unsharded: float  # the same plus the weight gradients produced so far


def rebuilt_in_backward(recompute: Recompute, is_block: bool) -> tuple[bool, Recompute]:
    """Whether a unit's backward rebuilds tensors its forward dropped, and the policy its operators
    then keep their tensors under: a rebuilt block (full or per-operator recomputation), or a module
    set's checkpointed modules (``CheckpointFunction.backward`` runs the module again and its recomputed
    tensors are freed as their operators' backward runs, as forward's are; ``CheckpointWithoutOutput``
    refills the freed output before its readers' backward). The walk counts them from the block's
    backward start: an upper bound for a module rebuilt only when backward reaches it."""
    rebuilt = is_block and (recompute.rebuilds_blocks or recompute.per_module)
    return rebuilt, (recompute.rebuilt_policy if rebuilt else recompute)


def backward_profile(gc: UnitGraph, unit: str, s: UnitStrategy, prec: Precision,
                     shared_keys: set[str]) -> BackwardProfile:
    """Profile of ``unit``'s backward under ``s``; items in ``shared_keys`` (saved by several units,
    counted once per stage) are left to the stage."""
    graph, act = gc.graph, prec.activation_bytes
    nodes = gc.nodes[unit]
    rebuilt, policy = rebuilt_in_backward(s.recompute, bool(nodes) and block_of(nodes[0]) is not None)

    # tensors kept from forward (a checkpointed block: its inputs) are activations; what the
    # recomputation rebuilds is temporary
    fp8 = prec.te_fp8
    kept = ({it.key for it in gc.saved(s.recompute, s.flash_attention, act, s.runtime, fp8)[0][unit]} if rebuilt
            else None)
    freed = freed_by_operator(NUMBERS, nodes, graph, act, s.flash_attention, policy, s.runtime, shared_keys, kept,
                              lambda n, it: gc.item_bytes((it,), s)[0], fp8)
    looped = looped_nodes(nodes, graph, s.runtime.loss_chunks)  # their backward ran inside forward
    trans = [0.0 if n.id in looped else _transient(gc, n, s, act, prec.grad_bytes) for n in nodes]
    made = [0.0 if n.id in looped else _weight_grad_bytes(gc, n, s, prec.grad_bytes) for n in nodes]
    alive, rebuilt_alive, grads = alive_at_operators(NUMBERS, freed, made)
    return BackwardProfile(max((a + t for a, t in zip(alive, trans, strict=True)), default=0.0),
                           max((a + t + g for a, t, g in zip(alive, trans, grads, strict=True)), default=0.0),
                           max((r + t for r, t in zip(rebuilt_alive, trans, strict=True)), default=0.0),
                           max((r + t + g for r, t, g in zip(rebuilt_alive, trans, grads, strict=True)), default=0.0))


def freed_by_operator(alg: Algebra[Q], nodes: Sequence[Node], graph: Graph, act: int, flash_attention: bool,
                      policy: Recompute, runtime: Runtime, shared_keys: set[str], kept: set[str] | None,
                      size: Callable[[Node, SavedItem], Q], fp8_inputs: bool = False) -> list[tuple[Q, Q]]:
    """Per operator of a unit (forward order): (the saved tensors its backward frees, of them what
    full recomputation rebuilt). The first saver (forward order) of each key frees it; ``policy``:
    the recomputation the unit's backward runs under; ``kept``: under full recomputation, what the
    block keeps from forward (the rest it rebuilds); ``shared_keys`` are left to the stage."""
    seen: set[str] = set()
    out = []
    for n in nodes:
        mine = rebuilt = alg.zero()
        for it in op_saved_items(n, graph, act, flash_attention=flash_attention, recompute=policy, runtime=runtime,
                                 fp8_inputs=fp8_inputs):
            if it.key in seen or it.key in shared_keys:
                continue
            seen.add(it.key)
            b = size(n, it)
            mine = alg.add(mine, b)
            if kept is not None and it.key not in kept:
                rebuilt = alg.add(rebuilt, b)
        out.append((mine, rebuilt))
    return out


def alive_at_operators(alg: Algebra[Q], freed: Sequence[tuple[Q, Q]],
                       made: Sequence[Q]) -> tuple[list[Q], list[Q], list[Q]]:
    """At each operator's backward (forward order): (the unit's saved tensors still alive, of them
    what recomputation rebuilt, the weight gradients the operators after it made), from what each
    operator's backward frees (:func:`freed_by_operator`) and makes."""
    alive, rebuilt_alive = [], []
    running = running_r = alg.zero()
    for mine, mine_r in freed:  # alive at the operator: what it frees and the earlier ones
        running, running_r = alg.add(running, mine), alg.add(running_r, mine_r)
        alive.append(running)
        rebuilt_alive.append(running_r)
    grads = [alg.zero()] * len(made)
    so_far = alg.zero()
    for k in reversed(range(len(made))):
        grads[k] = so_far
        so_far = alg.add(so_far, made[k])
    return alive, rebuilt_alive, grads


def forward_transient(gc: UnitGraph, unit: str, s: UnitStrategy, prec: Precision) -> float:
    """The most bytes of tensors ``unit``'s forward makes and does not keep for backward, alive at
    once (an operator's output and the unsaved inputs still to be read: the logits while the loss
    reads them). Views cost nothing; tensors read by other units stay to the end of the unit. A
    chunked loss's operators are left to :mod:`.loss_loop`."""
    act = prec.activation_bytes
    nodes = gc.nodes[unit]
    looped = looped_nodes(nodes, gc.graph, s.runtime.loss_chunks)
    kept = {it.key for items in gc.saved(s.recompute, s.flash_attention, act, s.runtime, prec.te_fp8)[0].values()
            for it in items}
    sizes = UnitSizes(gc.graph, s)

    def live_size(n: Node) -> float | None:
        if n.id in kept or n.id in looped or n.kind is OpKind.RESHAPE:
            return None
        # an operator's output as it makes it; a graph input as the unit's layout holds it
        return (local_elems(n, s) if n.kind is OpKind.INPUT else sizes.output(n)) * tensor_bytes(n, act)

    return max(forward_live(NUMBERS, nodes, gc.consumers, live_size,
                            lambda n: _cp_buffers(n, s, sizes, act, backward=False)), default=0.0)


def selective_rebuilt_items(n: Node, graph: Graph, act: int, recompute: Recompute, flash_attention: bool,
                            runtime: Runtime) -> list[SavedItem]:
    """What selective recomputation drops from ``n``'s saved buffers and its backward rebuilds."""
    if not recompute.core_attention or n.kind is not OpKind.ATTENTION:
        return []
    if flash_attention and not runtime.repeats_kv_heads:
        return []  # a flash kernel keeps no scores, and K and V are kept as they are: nothing to rebuild
    kept = {it.key for it in op_saved_items(n, graph, act, flash_attention=flash_attention, recompute=recompute,
                                            runtime=runtime)}
    return [it for it in op_saved_items(n, graph, act, flash_attention=flash_attention, recompute=Recompute.NONE,
                                        runtime=runtime) if it.key not in kept]


def op_transient_bytes(n: Node, graph: Graph, sizes: OpSizes, act: int, grad_bytes: int,
                       runtime: Runtime) -> float:
    """Gradients alive while ``n``'s backward runs: its output's, its activation inputs', its
    weights' (a sequence-parallel norm's gathered output too)."""
    out = sizes.output(n) * tensor_bytes(n, act) if is_float(n) else 0.0
    if n.kind is OpKind.CROSS_ENTROPY:  # the logits' gradient and the runtime's loss buffers, in their layout
        ins = sizes.input(n, 0) * loss_backward_bytes_per_logit(runtime, sizes.class_shards(n) > 1, act)
    else:
        ins = op_input_gradient_bytes(n, graph, sizes, act, runtime)
    gather = sizes.sp_gather(n) * act + sizes.recomputed_bytes(n)
    weights = op_weight_grad_bytes(n, graph, sizes, grad_bytes)
    if n.kind is OpKind.EMBEDDING and runtime.full_embedding_gradient:
        # the whole table's gradient is made from the output's; the output's gradient is freed
        # before the device's own rows are copied out of it
        whole = sum(p.numel for p in map(graph.node, n.inputs) if p.is_parameter) * grad_bytes
        return max(out + ins + whole, weights) + gather
    return out + ins + weights + gather


def op_input_gradient_bytes(n: Node, graph: Graph, sizes: OpSizes, act: int, runtime: Runtime) -> float:
    """Per-device bytes of the gradients of ``n``'s activation inputs its backward makes, in the
    layouts ``n`` reads them in (an attention's K and V at every query head where the runtime
    repeats them: the kernel's gradients, summed afterwards)."""
    ins = 0.0
    rep = kv_repeat(n, graph.node(n.inputs[0]), graph.node(n.inputs[1])) \
        if n.kind is OpKind.ATTENTION and runtime.repeats_kv_heads else 1
    for pos, i in enumerate(n.inputs):
        src = graph.node(i)
        if src.is_parameter or src.kind is OpKind.INPUT or not is_float(src):
            continue
        ins += sizes.input(n, pos) * act * (rep if pos in (1, 2) else 1)
    return ins


def op_weight_grad_bytes(n: Node, graph: Graph, sizes: OpSizes, grad_bytes: int) -> float:
    """Per-device bytes of the weight gradients ``n``'s backward makes."""
    return sum(sizes.weight_grad(n, pos) for pos, i in enumerate(n.inputs) if graph.node(i).is_parameter) * grad_bytes


class UnitSizes:
    """:class:`OpSizes` of a unit's operators under a per-unit strategy (Megatron-LM's layouts)."""

    def __init__(self, graph: Graph, s: UnitStrategy, act: int = 2) -> None:
        self.graph, self.s, self.mesh, self.act = graph, s, op_mesh(s), act

    def output(self, n: Node) -> float:
        lay = output_layout(n, uniform_strategy(n, self.graph, self.s), self.mesh, loop_dims(n, self.graph)[1])
        return n.numel / lay.shards(self.mesh.sizes)

    def input(self, n: Node, position: int) -> float:
        lay = input_layout(n, position, self.graph, uniform_strategy(n, self.graph, self.s), self.mesh)
        elems = self.graph.node(n.inputs[position]).numel / lay.shards(self.mesh.sizes)
        if self.s.cp > 1 and n.kind is OpKind.ATTENTION and position in (1, 2):
            elems /= self.s.cp  # a rank's own K/V share: the ring's other chunks are its buffers (the
            # all-to-all's head split holds as many bytes)
        return elems

    def weight_grad(self, n: Node, position: int) -> float:
        return weight_grad_workspace(n, self.graph.node(n.inputs[position]), self.s)

    def class_shards(self, n: Node) -> int:
        if n.kind is not OpKind.CROSS_ENTROPY:
            return 1
        lay = input_layout(n, 0, self.graph, uniform_strategy(n, self.graph, self.s), self.mesh)
        return lay.shards(self.mesh.sizes, [str(n.attrs.get("class_dim", "vocab"))])

    def sp_gather(self, n: Node) -> float:
        if self.s.sp and n.kind in (OpKind.LAYERNORM, OpKind.RMSNORM) and block_of(n):
            return n.numel / self.s.cp  # the rank's tokens, gathered over TP
        return 0.0

    def recomputed_bytes(self, n: Node) -> float:
        s = self.s
        items = selective_rebuilt_items(n, self.graph, self.act, s.recompute, s.flash_attention, s.runtime)
        if not items:
            return 0.0
        lay = output_layout(n, uniform_strategy(n, self.graph, s), self.mesh, loop_dims(n, self.graph)[1])
        return sum(it.total_bytes / lay.shards(self.mesh.sizes, it.dims) for it in items)


def _transient(gc: UnitGraph, n: Node, s: UnitStrategy, act: int, grad_bytes: int) -> float:
    sizes = UnitSizes(gc.graph, s, act)
    out = op_transient_bytes(n, gc.graph, sizes, act, grad_bytes, s.runtime)
    return out + _cp_buffers(n, s, sizes, act, backward=True)


def _cp_buffers(n: Node, s: UnitStrategy, sizes: UnitSizes, act: int, backward: bool) -> float:
    """Context parallelism's exchange buffers while attention ``n`` runs (0 for other operators)."""
    if s.cp <= 1 or n.kind is not OpKind.ATTENTION:
        return 0.0
    return cp_buffer_bytes(s.cp_comm, attention_bytes(n, sizes, act), backward)


def attention_bytes(n: Node, sizes: OpSizes, act: int) -> AttentionBytes:
    """Attention ``n``'s q, k plus v, and output as one rank holds them (under context parallelism:
    its tokens' share, which is also the size of its chunk of the ring)."""
    return AttentionBytes(sizes.input(n, 0) * act, (sizes.input(n, 1) + sizes.input(n, 2)) * act,
                          sizes.output(n) * act)


def _weight_grad_bytes(gc: UnitGraph, n: Node, s: UnitStrategy, grad_bytes: int) -> float:
    return op_weight_grad_bytes(n, gc.graph, UnitSizes(gc.graph, s), grad_bytes)

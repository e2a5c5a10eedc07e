"""A chunked loss: the output layer and the cross entropy run inside forward, chunk by chunk.

torchtitan's recipes wrap the loss in ``ChunkedLossWrapper`` (runtime property
:attr:`~parplan.solver.cost.runtime.Runtime.loss_chunks`). After the final norm it cuts the hidden
states into ``N`` sequence chunks and, for each, runs the output layer, the cross entropy and at once
that chunk's backward, adding the chunk's hidden-state gradient into an fp32 buffer. The step's
backward then starts from that buffer (cast to the compute type and saved by an autograd function).
So no logits are kept for backward, and the loop's own buffers peak at the end of forward, while
every block's saved tensors are alive. Measured with ``parplan validate --torchtitan`` on its debug
model (docs/notes/torchtitan-run.md); per device, bytes:

- for the whole loop: the model's output (the hidden states, compute type), its chunked copies (the
  output layer's saved input; the same size as the saved gradient that replaces them after the loop,
  so the unit's saved tensors count them) and the fp32 gradient accumulator;
- one chunk's cross entropy: its logits, the fp32 log-probabilities, their gradient and the logits'
  fp32 gradient (the runtime's loss buffers, :meth:`Runtime.loss_gradient_buffers`);
- one chunk's output-layer backward: its logits, their gradient and the chunk's hidden-state gradient,
  with the weight's gradient (see below);
- under FSDP2 the output layer stays gathered through the loop and its gradient is not reduced until
  the last chunk: each chunk's gradient (compute type) is added into an unsharded fp32 gradient, which
  the last chunk reduce-scatters through the unit's reduce buffers into its sharded gradient
  (:func:`loop_peak`); without gathering the gradient builds up in the parameter's own.

The first chunk's cast of its gradient to fp32 holds less than a later chunk's backward, so it is
not a moment of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from parplan.solver.cost.activations import LOSS_BYTES, loss_backward_bytes_per_logit
from parplan.solver.ir import Graph, Node, OpKind

if TYPE_CHECKING:
    from parplan.solver.cost.op_sizes import OpSizes
    from parplan.solver.cost.runtime import DataParallelBuffers, Runtime

#: Bytes per element of the loop's hidden-state gradient accumulator (``GradAccumulator``, fp32).
ACCUMULATOR_BYTES = 4.0


@dataclass(frozen=True)
class LossLoop:
    """The loop of a unit whose loss is chunked, apart from its weight's gradient (bytes per device)."""

    hidden: float  # the model's output and the fp32 gradient accumulator, alive through the loop
    chunk_loss: float  # one chunk's cross entropy at its busiest
    chunk_head_backward: float  # one chunk's output-layer backward, its weight's gradient apart
    chunk_logits: float  # one chunk's logits (alive until the next chunk's)
    weight_elems: float  # the output layer's weight, local elements (its gradient is reduced in the loop)


def looped_nodes(nodes: list[Node], graph: Graph, chunks: int) -> set[str]:
    """The cross entropies of ``nodes`` and the operators making their logits: what a chunked loss
    (``chunks`` > 0) runs, backward included, inside forward."""
    if chunks <= 0:
        return set()
    out: set[str] = set()
    for n in nodes:
        if n.kind is OpKind.CROSS_ENTROPY:
            out.add(n.id)
            out.add(n.inputs[0])
    return out


def loss_loop(graph: Graph, nodes: list[Node], sizes: OpSizes, runtime: Runtime, act: int) -> LossLoop | None:
    """The loop of the unit made of ``nodes``, its tensors sized by ``sizes`` (None without a chunked
    loss there); ``act``: bytes per element of the compute type."""
    chunks = runtime.loss_chunks
    loss = next((n for n in nodes if n.kind is OpKind.CROSS_ENTROPY), None) if chunks > 0 else None
    if loss is None:
        return None
    head = graph.node(loss.inputs[0])
    positions = [p for p, i in enumerate(head.inputs) if not graph.node(i).is_parameter]
    hidden = sum(sizes.input(head, p) for p in positions)  # the hidden states as the output layer reads them
    logits = sizes.output(head) / chunks
    per_logit = loss_backward_bytes_per_logit(runtime, sizes.class_shards(loss) > 1, act)
    return LossLoop(
        hidden=hidden * (act + ACCUMULATOR_BYTES),
        chunk_loss=logits * (act + LOSS_BYTES + per_logit),  # its logits, the saved log-probabilities
        chunk_head_backward=logits * 2 * act + hidden / chunks * act,
        chunk_logits=logits * act,
        weight_elems=sum(sizes.weight_grad(head, p) for p, i in enumerate(head.inputs)
                         if graph.node(i).is_parameter))


def loop_peak(loop: LossLoop, dp: DataParallelBuffers, gathered: float, unsharded_grads: float,
              sharded_grads: float) -> float:
    """The loop's busiest moment above what the stage holds besides it (the gathered weights among
    that): ``gathered`` the unit's weights in the compute type, ``unsharded_grads`` their gradient
    unsharded (fp32), ``sharded_grads`` the gradient the reduction outputs (bytes per device)."""
    moments: tuple[float, ...]
    if dp.gathers:
        moments = (
            loop.chunk_loss + unsharded_grads,  # a later chunk's loss; the fp32 gradient so far
            loop.chunk_head_backward + unsharded_grads + gathered,  # its backward: its weight's gradient too
            # the last chunk's reduction: the summed gradient, the reduce buffers and the sharded output
            loop.chunk_logits + (dp.reduce_buffers + 2) * unsharded_grads + sharded_grads,
        )
    else:  # the gradient builds up in the parameter's own, made by the first chunk
        moments = (loop.chunk_loss + unsharded_grads, loop.chunk_head_backward + 2 * unsharded_grads)
    return loop.hidden + max(moments)


__all__ = ["ACCUMULATOR_BYTES", "LossLoop", "loop_peak", "looped_nodes", "loss_loop"]

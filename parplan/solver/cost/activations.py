"""What each operator saves for its backward pass, and what recomputation drops.

The rules reproduce Korthikanti et al. (2022), "Reducing activation recomputation in large
transformer models", Sec. 4: a GPT layer saves ``sbh(34 + 5as/h)`` bytes in 16-bit training.
Per transformer block the builder's graph gives exactly those terms:

- LayerNorm: its input (2sbh each, two of them);
- linear layers: their (non-parameter) input (QKV input 2sbh, output-projection input 2sbh,
  MLP up-projection input 2sbh, down-projection input 8sbh);
- attention core: Q, K, V (6sbh) and, without flash attention or selective recomputation,
  the softmax output (2as²b), the dropout mask (as²b) and the dropped-out probabilities (2as²b);
- GELU: its input (8sbh); dropout: a 1-byte mask (sbh each, two of them).

A tensor saved by several operators (the LayerNorm output feeding Q, K and V) counts once: items
are keyed. Tensors are counted in their producer's layout, i.e. a sequence-parallel input that an
operator all-gathers is saved sharded and gathered again in backward, as Megatron-LM does.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum

from parplan.solver.cost.runtime import Runtime
from parplan.solver.ir import DTYPE_BYTES, Graph, Node, OpKind, attention_dims, attention_geometry

#: Bytes per element of the loss's probabilities and their gradients (computed in fp32).
LOSS_BYTES = 4.0

_FLOATS = frozenset({"bf16", "fp16", "fp32", "tf32", "fp8"})
_SAVES_OUTPUT = frozenset({"tanh", "sigmoid", "exp"})
_SAVES_INPUT = frozenset({"gelu", "silu", "relu"})


class Recompute(StrEnum):
    """Activation recomputation policy (Megatron-LM's names)."""

    NONE = "none"  # keep everything
    SELECTIVE = "selective"  # recompute the attention core (drops the s^2 terms)
    FULL = "full"  # recompute whole blocks; keep only each block's inputs


@dataclass(frozen=True)
class SavedItem:
    """One buffer kept for backward: ``numel`` elements of ``elem_bytes`` each, cut like the
    layout of node ``owner`` restricted to ``dims`` (``None``: all of the owner's dims)."""

    key: str
    owner: str
    numel: int
    elem_bytes: float
    dims: frozenset[str] | None = None

    @property
    def total_bytes(self) -> float:
        return self.numel * self.elem_bytes


def is_float(node: Node) -> bool:
    """Whether ``node``'s tensor holds floating-point values (and so has a gradient)."""
    return node.dtype in _FLOATS


def tensor_bytes(node: Node, activation_bytes: int) -> int:
    """Bytes per element of a node's output: floats at the training activation precision
    (fp32 stays fp32 when explicitly declared so by a loss), integers at their own size."""
    if is_float(node):
        return 4 if node.dtype == "fp32" else activation_bytes
    return DTYPE_BYTES[node.dtype]


def _tensor(node: Node, activation_bytes: int) -> SavedItem:
    return SavedItem(node.id, node.id, node.numel, tensor_bytes(node, activation_bytes))


def op_saved_items(node: Node, graph: Graph, activation_bytes: int, *, flash_attention: bool,
                   recompute: Recompute, runtime: Runtime = Runtime.MEGATRON) -> list[SavedItem]:
    """Buffers ``node`` keeps for backward (parameters are never activations); remembered on the
    graph for its own nodes (the searches ask for the same ones many times)."""
    if not graph.owns(node):
        return _op_saved_items(node, graph, activation_bytes, flash_attention, recompute, runtime)
    cache = graph.memo.setdefault("op_saved_items", {})
    key = (node.id, activation_bytes, flash_attention, recompute, runtime)
    hit = cache.get(key)
    if hit is None:
        hit = cache[key] = tuple(_op_saved_items(node, graph, activation_bytes, flash_attention, recompute, runtime))
    return list(hit)


def _op_saved_items(node: Node, graph: Graph, activation_bytes: int, flash_attention: bool,
                    recompute: Recompute, runtime: Runtime) -> list[SavedItem]:
    ins = [graph.node(i) for i in node.inputs]
    acts = [i for i in ins if not i.is_parameter and i.kind is not OpKind.PARAMETER]
    k = node.kind
    if k is OpKind.EINSUM or k is OpKind.COMBINE:
        return [_tensor(i, activation_bytes) for i in acts]
    if k is OpKind.ELEMENTWISE:
        fn = node.attrs.get("fn")
        if fn == "mul":
            return [_tensor(i, activation_bytes) for i in acts]
        if fn in _SAVES_INPUT:
            return [_tensor(i, activation_bytes) for i in acts[:1]]
        if fn in _SAVES_OUTPUT:
            return [_tensor(node, activation_bytes)]
        return []
    if k is OpKind.DROPOUT:
        return [SavedItem(f"{node.id}#mask", node.id, node.numel, 1.0)]
    if k is OpKind.SOFTMAX:
        return [_tensor(node, activation_bytes)]
    if k is OpKind.RMSNORM and runtime.rmsnorm_saves_normalized:
        # composite RMSNorm computing in fp32: x (upcast) for the norm's gradient, x·rstd for the weight's
        x = ins[0]
        upcast = tensor_bytes(x, activation_bytes) < 4  # a copy of its own, not x itself
        return [SavedItem(f"{x.id}#fp32" if upcast else x.id, x.id, x.numel, 4.0),
                SavedItem(f"{node.id}#normalized", node.id, node.numel, 4.0)]
    if k in (OpKind.LAYERNORM, OpKind.RMSNORM, OpKind.EMBEDDING):
        return [_tensor(ins[0], activation_bytes)]
    if k is OpKind.ATTENTION:
        items = [_tensor(i, activation_bytes) for i in ins[:3]] + [_tensor(node, activation_bytes)]
        rep = kv_repeat(node, ins[0], ins[1]) if runtime.repeats_kv_heads else 1
        if rep > 1 and recompute is not Recompute.SELECTIVE:
            # K and V repeated to every query head before the kernel, which keeps those (selective
            # recomputation keeps the core's inputs and repeats them again in backward)
            items[1:3] = [SavedItem(f"{i.id}#repeated", i.id, i.numel * rep, tensor_bytes(i, activation_bytes))
                          for i in ins[1:3]]
        if not flash_attention and recompute is Recompute.NONE:
            geo = attention_geometry(node, ins[0], ins[1])
            per_elem = float(activation_bytes)  # softmax output
            if float(node.attrs.get("dropout", 0.0)) > 0:
                per_elem += 1 + activation_bytes  # dropout mask + dropped-out probabilities
            q_dims = frozenset(d for d, _ in ins[0].dims)
            items.append(SavedItem(f"{node.id}#scores", node.id, geo.scores_numel, per_elem, q_dims))
        return items
    if k is OpKind.CROSS_ENTROPY:
        if runtime.loss_chunks:  # a chunked loss runs its backward inside forward (cost.loss_loop)
            return []
        # Softmax of the logits kept in fp32 (Megatron-LM's vocab-parallel cross entropy; PyTorch's
        # log_softmax keeps its fp32 log-probabilities, the same size).
        return [SavedItem(f"{node.id}#probs", ins[0].id, ins[0].numel, LOSS_BYTES)]
    if k is OpKind.DISPATCH:
        return [_tensor(ins[1], activation_bytes)]
    return []


def kv_repeat(node: Node, q: Node, k: Node) -> int:
    """How many query heads share each key/value head of a self-attention node (grouped-query
    attention; 1 otherwise)."""
    _, kv_name = attention_dims(node, q, k)
    if dict(q.dims).get(kv_name) != dict(k.dims)[kv_name] or k.numel >= q.numel:
        return 1
    return max(1, round(q.numel / k.numel))


def block_of(node: Node) -> str | None:
    """The repeated block a node belongs to (``layers.3``, ``decoder.0``), or None."""
    tag = node.layer
    if tag is None:
        return None
    head, _, tail = tag.rpartition(".")
    return tag if head and tail.isdigit() else None


def saved_items(graph: Graph, nodes: Iterable[Node], activation_bytes: int, *, flash_attention: bool,
                recompute: Recompute, runtime: Runtime = Runtime.MEGATRON) -> Iterator[SavedItem]:
    """Saved buffers of ``nodes`` under a recomputation policy (duplicates possible; key them).

    With full recomputation, each block keeps only the non-parameter tensors it reads from outside
    itself (its checkpointed inputs); nodes outside blocks keep their usual buffers.
    """
    for n in nodes:
        blk = block_of(n) if recompute is Recompute.FULL else None
        if blk is None:
            yield from op_saved_items(n, graph, activation_bytes, flash_attention=flash_attention,
                                      recompute=recompute, runtime=runtime)
            continue
        for i in n.inputs:
            src = graph.node(i)
            if not src.is_parameter and block_of(src) != blk:
                yield _tensor(src, activation_bytes)

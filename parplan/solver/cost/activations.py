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

A gated MLP (SwiGLU, ffn width ``f``) keeps per token the SiLU's input (the gate, ``f``), the
product's inputs (the SiLU output and the up half, ``2f``) and the down projection's input (``f``):
``4f`` elements, as PyTorch's autograd keeps them for ``silu(gate) * up``. Megatron-LM's fused SwiGLU
keeps fc1's output (gate and up, ``2f``) and computes the SiLU again in backward: ``3f`` with the
down projection's input (:func:`fused_swiglu_activation`).

A tensor saved by several operators (the LayerNorm output feeding Q, K and V) counts once: items
are keyed. Tensors are counted in their producer's layout, i.e. a sequence-parallel input that an
operator all-gathers is saved sharded and gathered again in backward, as Megatron-LM does.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from parplan.solver.cost import recompute_modules
from parplan.solver.cost.runtime import Runtime
from parplan.solver.ir import DTYPE_BYTES, Graph, Node, OpKind, attention_dims, attention_geometry

#: Bytes per element of the loss's probabilities and their gradients (computed in fp32).
LOSS_BYTES = 4.0

_FLOATS = frozenset({"bf16", "fp16", "fp32", "tf32", "fp8"})
_SAVES_OUTPUT = frozenset({"tanh", "sigmoid", "exp"})
_SAVES_INPUT = frozenset({"gelu", "silu", "relu"})


class Recompute(StrEnum):
    """Activation recomputation policy (Megatron-LM's names, and torchtitan's per-operator one).

    Besides the four named ones, Megatron-LM's module sets (``--recompute-modules``) are policies
    too: ``Recompute("selective:core_attn+mlp")`` (:mod:`~parplan.solver.cost.recompute_modules`),
    one object per set, so that they compare by identity like the named ones."""

    NONE = "none"  # keep everything
    SELECTIVE = "selective"  # recompute the attention core (drops the s^2 terms)
    FULL = "full"  # recompute whole blocks; keep only each block's inputs
    OP = "op"  # checkpoint whole blocks keeping the outputs of the ops torchtitan's policy saves

    @classmethod
    def _missing_(cls, value: object) -> Any:
        if not isinstance(value, str) or not value.startswith(recompute_modules.PREFIX):
            return None
        canonical = recompute_modules.modules_value(recompute_modules.parse_modules(
            value[len(recompute_modules.PREFIX):]))
        known = cls._value2member_map_.get(canonical)
        if known is not None:
            return known
        member = str.__new__(cls, canonical)
        member._name_ = canonical
        member._value_ = canonical
        return cls._value2member_map_.setdefault(canonical, member)

    @classmethod
    def of_modules(cls, modules: Iterable[str]) -> Recompute:
        """The policy recomputing Megatron-LM's ``modules`` (none: :attr:`NONE`; the attention core
        alone: :attr:`SELECTIVE`); ValueError for a name Megatron-LM does not know."""
        mods = recompute_modules.parse_modules(" ".join(modules))
        return cls(recompute_modules.modules_value(mods))

    @property
    def modules(self) -> frozenset[str]:
        """Megatron-LM's checkpointed modules: ``core_attn`` for :attr:`SELECTIVE`, the set of a
        module policy, none for the others."""
        if self is Recompute.SELECTIVE:
            return recompute_modules.DEFAULT
        if self.value.startswith(recompute_modules.PREFIX):
            return recompute_modules.parse_modules(self.value[len(recompute_modules.PREFIX):])
        return frozenset()

    @property
    def per_module(self) -> bool:
        """Whether this is a module set beyond the attention core (``selective:...``)."""
        return self.value.startswith(recompute_modules.PREFIX)

    @property
    def core_attention(self) -> bool:
        """Whether the attention core is checkpointed (Megatron-LM's ``core_attn``)."""
        return "core_attn" in self.modules

    @property
    def rebuilds_blocks(self) -> bool:
        """Whether a block's backward runs its forward again from what the block kept (the
        recomputed buffers transient, alive during that block's backward only)."""
        return self in (Recompute.FULL, Recompute.OP)

    @property
    def rebuilt_policy(self) -> Recompute:
        """What a block's backward holds once its recomputation ran: everything (:attr:`NONE`) for a
        rebuilt block; for a module set, what its checkpointed modules and the readers of a freed output
        keep without the checkpoint (the attention core still checkpointed under ``core_attn``, which
        has its own rebuilt items); the policy itself otherwise."""
        if self.rebuilds_blocks:
            return Recompute.NONE
        if self.per_module:
            return Recompute.of_modules(self.modules & recompute_modules.DEFAULT)
        return self


#: :attr:`SavedItem.reduction`: a matmul's output as each device computes it, before a tensor-parallel
#: reduction (partial sums, whole over the sequence); and the output of that reduction when it is a
#: reduce-scatter (sequence parallelism), none when it is an all-reduce or there is none.
UNREDUCED = "unreduced"
SCATTERED = "scattered"


@dataclass(frozen=True)
class SavedItem:
    """One buffer kept for backward: ``numel`` elements of ``elem_bytes`` each, cut like the
    layout of node ``owner`` restricted to ``dims`` (``None``: all of the owner's dims), or, with a
    ``reduction`` (:data:`UNREDUCED`, :data:`SCATTERED`), like the owner's output before or after its
    tensor-parallel reduction."""

    key: str
    owner: str
    numel: int
    elem_bytes: float
    dims: frozenset[str] | None = None
    reduction: str = ""

    @property
    def total_bytes(self) -> float:
        return self.numel * self.elem_bytes


def loss_backward_bytes_per_logit(runtime: Runtime, classes_sharded: bool, activation_bytes: float) -> float:
    """Bytes per logit the loss's backward makes, alive at once with the saved probabilities: the
    logits' gradient and the runtime's loss buffers (:meth:`Runtime.loss_gradient_buffers`, fp32).

    PyTorch's ``cross_entropy`` runs on the logits cast to fp32, so the gradient its backward makes
    is fp32 whatever the compute type: ``_log_softmax_backward_data`` returns its input's dtype, and
    ``.float()``'s backward (``ToCopyBackward0``) casts it to the compute type only after the
    log-probabilities and their gradient are freed (4 + 2 bytes then, below the 12 before). Measured
    with PyTorch's ``MemTracker`` on CPU, ``cross_entropy(x.float(), y)`` then ``backward()``: 12
    bytes per logit above the logits for bf16 and fp32 ``x`` alike (tests/solver/test_loss_gradient.py).
    Megatron-LM's and nanotron's fused losses make the gradient in place, in the compute type."""
    buffers = runtime.loss_gradient_buffers(classes_sharded)
    return (LOSS_BYTES if buffers else activation_bytes) + buffers * LOSS_BYTES


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
                   recompute: Recompute, runtime: Runtime = Runtime.MEGATRON,
                   fp8_inputs: bool = False) -> list[SavedItem]:
    """Buffers ``node`` keeps for backward (parameters are never activations); remembered on the
    graph for its own nodes (the searches ask for the same ones many times). ``fp8_inputs``: the
    precision is Transformer Engine's FP8 (:attr:`~parplan.solver.cost.precision.Precision.te_fp8`)."""
    if not graph.owns(node):
        return _op_saved_items(node, graph, activation_bytes, flash_attention, recompute, runtime, fp8_inputs)
    cache = graph.memo.setdefault("op_saved_items", {})
    key = (node.id, activation_bytes, flash_attention, recompute, runtime, fp8_inputs)
    hit = cache.get(key)
    if hit is None:
        hit = cache[key] = tuple(_op_saved_items(node, graph, activation_bytes, flash_attention, recompute, runtime,
                                                 fp8_inputs))
    return list(hit)


def fp8_gemm_weights(node: Node, graph: Graph) -> list[Node]:
    """The weights of a matmul an FP8 precision runs at its ``matmul_dtype``: an einsum with weights,
    none over the vocabulary (Megatron-LM keeps the embedding and output layer in bf16); [] otherwise."""
    if node.kind is not OpKind.EINSUM:
        return []
    weights = [graph.node(i) for i in node.inputs if graph.node(i).is_parameter]
    return [] if any("vocab" in w.shape for w in weights) else weights


#: Bytes per element of the input a Transformer Engine FP8 GEMM saves for backward, per-tensor scaling
#: (delayed or current): the input cast to FP8, column-wise only (what the weight-gradient GEMM reads),
#: or row-wise only where sequence parallelism gathers it again in backward (Float8 quantizers support
#: only row-wise all-gather); the bf16 input is not saved. TE's module/linear.py and
#: layernorm_linear.py: ``update_usage(rowwise_usage=False, columnwise_usage=True)`` before saving.
TE_FP8_SAVED_INPUT_BYTES = 1.0


def _saves_fp8_input(node: Node, graph: Graph, runtime: Runtime) -> bool:
    """Whether Megatron-LM runs ``node`` as a Transformer Engine FP8 GEMM that saves its input in FP8:
    a matmul at ``matmul_dtype`` (:func:`fp8_gemm_weights`) but the router (its output over the experts
    from an input that is not: Megatron-LM's ``TopKRouter`` is a plain PyTorch GEMM)."""
    if runtime is not Runtime.MEGATRON or not fp8_gemm_weights(node, graph):
        return False
    return "expert" not in node.shape or any("expert" in graph.node(i).shape for i in node.inputs
                                             if not graph.node(i).is_parameter)


def _projection(node: Node, graph: Graph) -> Node:
    """The matmul under ``node`` when ``node`` adds a bias to it (a biased linear layer), else ``node``."""
    if node.kind is OpKind.ELEMENTWISE and node.attrs.get("fn") == "add":
        mm = graph.node(node.inputs[0])
        if mm.kind is OpKind.EINSUM:
            return mm
    return node


def fused_swiglu_activation(node: Node, graph: Graph) -> Node | None:
    """The SiLU output a SwiGLU product ``node`` multiplies, when its gate and up halves come from one
    GEMM (a ``gemm_group``: Megatron-LM's ``linear_fc1``); None for any other operator. Under a runtime
    that :attr:`~parplan.solver.cost.runtime.Runtime.fuses_gated_activation`, the fused function keeps
    fc1's output (the gate, which the SiLU keeps, and the up half, which the product keeps) and
    computes the SiLU again in backward, so the product does not keep the SiLU output."""
    if node.kind is not OpKind.ELEMENTWISE or node.attrs.get("fn") != "mul" or len(node.inputs) != 2:
        return None
    act, up = (graph.node(i) for i in node.inputs)
    if act.kind is not OpKind.ELEMENTWISE or act.attrs.get("fn") != "silu":
        return None
    group = _projection(graph.node(act.inputs[0]), graph).attrs.get("gemm_group")
    return act if group is not None and _projection(up, graph).attrs.get("gemm_group") == group else None


def _weighted_expert_input(node: Node, graph: Graph) -> bool:
    """Whether ``node`` is an expert's down projection whose input a runtime that
    :attr:`~parplan.solver.cost.runtime.Runtime.weights_experts_in_activation` computes as the
    activation's output times the router probabilities, a product that keeps the activation's output
    (an output of its own, besides the product the projection keeps): a GELU expert's; a fused SwiGLU's
    (:func:`fused_swiglu_activation`) keeps only fc1's output. The probabilities it keeps too, one per
    routed token, are not counted."""
    weights = [graph.node(i) for i in node.inputs if graph.node(i).is_parameter]
    acts = [graph.node(i) for i in node.inputs if not graph.node(i).is_parameter]
    if len(weights) != 1 or len(acts) != 1 or "expert" not in weights[0].shape:
        return False
    x = acts[0]
    return ("ffn" in x.shape and "ffn" not in node.shape and x.kind is OpKind.ELEMENTWISE
            and fused_swiglu_activation(x, graph) is None)


def _op_saved_items(node: Node, graph: Graph, activation_bytes: int, flash_attention: bool,
                    recompute: Recompute, runtime: Runtime, fp8_inputs: bool = False) -> list[SavedItem]:
    if not recompute.per_module:
        return _plain_saved_items(node, graph, activation_bytes, flash_attention, recompute, runtime, fp8_inputs)
    return module_saved_items(node, graph, activation_bytes, flash_attention, recompute, runtime, fp8_inputs)


def module_saved_items(node: Node, graph: Graph, activation_bytes: int, flash_attention: bool,
                       recompute: Recompute, runtime: Runtime, fp8_inputs: bool = False) -> list[SavedItem]:
    """What ``node`` keeps under a Megatron-LM module set (:mod:`~.recompute_modules`): inside a
    checkpointed region, the region's inputs it reads (what the checkpoint keeps, in their own
    precision: ``tensor_parallel.checkpoint`` and ``CheckpointWithoutOutput`` save the tensors they
    are given); elsewhere its usual buffers; nothing a ``CheckpointWithoutOutput`` frees (its
    region's outputs, read outside it)."""
    reg = recompute_modules.regions(graph, recompute.modules, runtime.fuses_norms)
    mine = reg.region.get(node.id)
    if mine is None:
        items = _plain_saved_items(node, graph, activation_bytes, flash_attention, recompute, runtime, fp8_inputs)
    else:
        srcs = (graph.node(i) for i in dict.fromkeys(node.inputs))
        items = [_tensor(src, activation_bytes) for src in srcs
                 if not src.is_parameter and src.kind is not OpKind.PARAMETER and reg.region.get(src.id) != mine]
    return [it for it in items if reg.discarded.get(it.owner, mine) == mine]


def module_rebuilt_items(graph: Graph, nodes: list[Node], activation_bytes: int, *, flash_attention: bool,
                         recompute: Recompute, runtime: Runtime = Runtime.MEGATRON,
                         fp8_inputs: bool = False) -> list[SavedItem]:
    """What the backward of the checkpointed Megatron-LM modules among ``nodes`` (one unit) rebuilds:
    what their operators, and the readers of a freed output, keep without the checkpoint and do not
    keep with it (``CheckpointFunction.backward`` runs the module's forward again with autograd on;
    ``CheckpointWithoutOutput`` refills the freed output). Counted all at once, an upper bound: a MoE
    layer's rebuilt pre-MLP norm output is alive through the whole layer's backward, the experts'
    rebuilt activation inside it."""
    if not recompute.per_module:
        return []
    reg = recompute_modules.regions(graph, recompute.modules, runtime.fuses_norms)
    light = recompute.rebuilt_policy
    kept = {it.key for it in saved_items(graph, nodes, activation_bytes, flash_attention=flash_attention,
                                         recompute=recompute, runtime=runtime, fp8_inputs=fp8_inputs)}
    out: dict[str, SavedItem] = {}
    for n in nodes:
        if n.id in reg.region or any(i in reg.discarded for i in n.inputs):
            for it in op_saved_items(n, graph, activation_bytes, flash_attention=flash_attention, recompute=light,
                                     runtime=runtime, fp8_inputs=fp8_inputs):
                if it.key not in kept:
                    out.setdefault(it.key, it)
    return list(out.values())


def _plain_saved_items(node: Node, graph: Graph, activation_bytes: int, flash_attention: bool,
                       recompute: Recompute, runtime: Runtime, fp8_inputs: bool = False) -> list[SavedItem]:
    ins = [graph.node(i) for i in node.inputs]
    acts = [i for i in ins if not i.is_parameter and i.kind is not OpKind.PARAMETER]
    k = node.kind
    if k is OpKind.EINSUM:
        if fp8_inputs and _saves_fp8_input(node, graph, runtime):
            # a buffer of its own: the bf16 tensor counts too where another operator keeps it
            items = [SavedItem(f"{i.id}#fp8", i.id, i.numel, TE_FP8_SAVED_INPUT_BYTES) if is_float(i)
                     else _tensor(i, activation_bytes) for i in acts]
        else:
            items = [_tensor(i, activation_bytes) for i in acts]
        if runtime.weights_experts_in_activation and _weighted_expert_input(node, graph):
            x = acts[0]
            items.append(SavedItem(f"{x.id}#unweighted", x.id, x.numel, tensor_bytes(x, activation_bytes)))
        return items
    if k is OpKind.COMBINE:
        # the probabilities and, where the combine weights the experts' outputs, those outputs
        kept = acts[1:] if runtime.weights_experts_in_activation else acts
        return [_tensor(i, activation_bytes) for i in kept]
    if k is OpKind.ELEMENTWISE:
        fn = node.attrs.get("fn")
        if fn == "mul":
            fused = fused_swiglu_activation(node, graph) if runtime.fuses_gated_activation else None
            return [_tensor(i, activation_bytes) for i in acts if i is not fused]
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
        if rep > 1 and not recompute.core_attention:
            # K and V repeated to every query head before the kernel, which keeps those (selective
            # recomputation keeps the core's inputs and repeats them again in backward)
            items[1:3] = [SavedItem(f"{i.id}#repeated", i.id, i.numel * rep, tensor_bytes(i, activation_bytes))
                          for i in ins[1:3]]
        keeps_scores = recompute is Recompute.NONE or (recompute.per_module and not recompute.core_attention)
        if not flash_attention and keeps_scores:
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
                recompute: Recompute, runtime: Runtime = Runtime.MEGATRON,
                fp8_inputs: bool = False) -> Iterator[SavedItem]:
    """Saved buffers of ``nodes`` under a recomputation policy (duplicates possible; key them).

    With full recomputation, each block keeps only the non-parameter tensors it reads from outside
    itself (its checkpointed inputs); with per-operator checkpointing, those and the outputs of the
    operators the policy saves (:func:`op_sac_saved`); nodes outside blocks keep their usual buffers.
    """
    for n in nodes:
        blk = block_of(n) if recompute.rebuilds_blocks else None
        if blk is None:
            yield from op_saved_items(n, graph, activation_bytes, flash_attention=flash_attention,
                                      recompute=recompute, runtime=runtime, fp8_inputs=fp8_inputs)
            continue
        for i in n.inputs:
            src = graph.node(i)
            if not src.is_parameter and block_of(src) != blk:
                yield _tensor(src, activation_bytes)
        if recompute is Recompute.OP:
            yield from _op_sac_outputs(n, graph, activation_bytes, flash_attention, runtime)


def is_weight_mm(node: Node, graph: Graph) -> bool:
    """Whether ``node`` runs as ``aten.mm`` in a PyTorch model: a matmul with a dense weight (an
    expert's weight, with an ``expert`` dim, runs as a grouped GEMM; a router's, whose output has
    an ``expert`` dim, torchtitan forces to recompute and does not count)."""
    if node.kind is not OpKind.EINSUM or "expert" in node.shape:
        return False
    weights = [graph.node(i) for i in node.inputs if graph.node(i).is_parameter]
    return bool(weights) and not any("expert" in w.shape for w in weights)


def op_sac_saved(node: Node, graph: Graph, runtime: Runtime) -> bool:
    """Whether torchtitan's per-operator policy keeps ``node``'s output (a block's operator):
    ``torchtitan/distributed/activation_checkpoint.py`` ``_apply_op_sac`` saves the outputs of the ops
    of its save list (``aten.mm``, the SDPA kernels, ``aten.max``, the reduce-scatter) except every
    second ``aten.mm``, counted from 1 per block in forward order (the count restarts with each
    checkpointed call). On CPU kernels SDPA runs ``_scaled_dot_product_flash_attention_for_cpu``,
    which the list does not hold: attention is recomputed there."""
    if node.kind is OpKind.ATTENTION:
        return not runtime.cpu_kernels
    if not is_weight_mm(node, graph):
        return False
    blk = block_of(node)
    if blk is None:
        return False
    saved = graph.memo.setdefault("op_sac_mm", {})
    if blk not in saved:
        mms = [n.id for n in graph.nodes if block_of(n) == blk and is_weight_mm(n, graph)]
        saved[blk] = frozenset(mms[::2])  # the 1st, 3rd, 5th ... mm of the block
    return node.id in saved[blk]


def _op_sac_outputs(node: Node, graph: Graph, activation_bytes: int, flash_attention: bool,
                    runtime: Runtime) -> list[SavedItem]:
    """What the per-operator policy keeps of a block's operator: a saved matmul's output as the
    device computed it (before a tensor-parallel reduction); the reduce-scatter after any matmul
    (sequence parallelism; an all-reduce is not on the save list); a saved attention kernel's output
    and its softmax statistics (the flash and memory-efficient kernels' fp32 log-sum-exp per query
    row and head) or, the math kernel, its probabilities too."""
    out = []
    if is_weight_mm(node, graph):
        b = tensor_bytes(node, activation_bytes)
        out.append(SavedItem(f"{node.id}#scattered", node.id, node.numel, b, reduction=SCATTERED))
        if op_sac_saved(node, graph, runtime):
            out.append(SavedItem(node.id, node.id, node.numel, b, reduction=UNREDUCED))
        return out
    if node.kind is not OpKind.ATTENTION or not op_sac_saved(node, graph, runtime):
        return out
    out.append(_tensor(node, activation_bytes))
    q, k = graph.node(node.inputs[0]), graph.node(node.inputs[1])
    if flash_attention:
        head_dim = node.dims[-1]
        rows = frozenset(d for d, _ in node.dims[:-1])
        out.append(SavedItem(f"{node.id}#lse", node.id, node.numel // head_dim[1], 4.0, rows))  # fp32
    else:
        geo = attention_geometry(node, q, k)
        out.append(SavedItem(f"{node.id}#probs", node.id, geo.scores_numel, float(activation_bytes),
                             frozenset(d for d, _ in q.dims)))
    return out

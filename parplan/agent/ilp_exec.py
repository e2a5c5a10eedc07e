"""Run an ILP plan — one sharding strategy per operator — with DTensor, and measure it.

The ILP's plans are not Megatron-style degrees but a layout per operator on a device mesh
(:mod:`parplan.solver.ilp.strategies`). This module executes such a plan as it is written: the
operator graph of the model is interpreted node by node on DTensors over a
:func:`~torch.distributed.device_mesh.init_device_mesh` mesh of the plan's shape, and for every
operator

- each input is redistributed to the layout the operator's strategy needs (slicing, all-gather,
  all-to-all, reduce-scatter or all-reduce, as DTensor's ``redistribute`` chooses for the pair of
  placements; on gloo, where DTensor has no all-to-all, :mod:`.alltoall` does that exchange);
- the operator runs on those DTensors (DTensor's own sharding propagation computes the local
  part; a split contracted dim leaves partial sums);
- its output is redistributed to the layout the strategy gives it.

A layout maps to placements per mesh axis: ``Shard(i)`` when the axis splits the tensor's ``i``-th
dim (a dim split over two axes is sharded on both, outer axis first), ``Partial()`` for pending
sums, ``Replicate()`` otherwise. Parameters live in their owner's layout; with ZeRO-3 they are also
sharded over the strategy's data axes and all-gathered where used (their gradients come back
reduce-scattered). ZeRO-1/2 are not executed (plans for the agent are searched with ZeRO 0 or 3).

Operators supported: the GPT and Llama families' as the builder writes them (embedding, einsum,
elementwise add / multiply / GELU / SiLU, dropout, LayerNorm and RMSNorm over the last dim, causal
attention with grouped-query heads through PyTorch's fused kernel, cross entropy), and what a traced
Hugging Face graph adds (:mod:`.graph_ops`: broadcasting by name, reshape, concat, select / mean
reductions, softmax, attention with a mask input; :mod:`.moe_exec`: MoE dispatch and combine, with
expert parallelism over an all-to-all). A traced graph travels in the spec as its wire document.
RMSNorm keeps ``x`` and ``rstd`` for backward, as fused GPU kernels do (PyTorch's CPU composite
would also keep ``x·rstd``), and a vocabulary-split embedding looks up its own rows only: the cost
model prices these runs with ``Runtime.INTERPRETER_CPU``. Cross entropy gathers split logits (no
vocabulary-parallel loss). The reference is the same interpreter on plain tensors in one process.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812 - PyTorch's convention
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torch.utils.checkpoint import checkpoint

from parplan.agent import graph_ops, moe_exec
from parplan.agent.alltoall import all_to_all_redistribute
from parplan.agent.executor import device_for_rank, summarise_contents
from parplan.agent.memtrack import CategoryTracker, mark_activation
from parplan.solver.cost.layout import TensorLayout
from parplan.solver.cost.op_layout import renaming
from parplan.solver.cost.units import GraphCosts
from parplan.solver.errors import StrategyError
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.ilp.strategies import Mesh, OpStrategy, data_axes, input_layout, loop_dims, output_layout
from parplan.solver.ir import Graph, Node, OpKind
from parplan.solver.wire import graph_from_json

SUPPORTED = frozenset({OpKind.INPUT, OpKind.PARAMETER, OpKind.EINSUM, OpKind.ELEMENTWISE, OpKind.DROPOUT,
                       OpKind.LAYERNORM, OpKind.RMSNORM, OpKind.ATTENTION, OpKind.EMBEDDING,
                       OpKind.CROSS_ENTROPY, OpKind.SOFTMAX, OpKind.RESHAPE, OpKind.REDUCE, OpKind.CONCAT,
                       OpKind.DISPATCH, OpKind.COMBINE})


@dataclass
class IlpRunSpec:
    """What the ranks run: the model, the micro-step, the mesh and every operator's strategy."""

    model: dict[str, Any]  # TransformerConfig fields ({} when ``graph_doc`` gives the graph)
    batch: int  # samples per micro-step (over the whole mesh)
    seq_len: int
    mesh: list[int]  # axis sizes, outermost first
    strategies: dict[str, dict[str, Any]]  # op id -> {"assignment": [dim or None per axis], "zero": int}
    seed: int = 0
    label: str = ""
    diagnose: bool = False  # also report what was alive at each category's peak
    extra: dict[str, Any] = field(default_factory=dict)
    graph_doc: dict[str, Any] | None = None  # a traced graph's wire document, built for ``batch``

    @property
    def world(self) -> int:
        return math.prod(self.mesh)

    def config(self) -> TransformerConfig:
        return TransformerConfig(**self.model)

    def graph(self) -> Graph:
        if self.graph_doc is not None:
            return graph_from_json(self.graph_doc)
        return build_graph(self.config(), batch=self.batch, seq_len=self.seq_len)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_graph(graph: Graph) -> None:
    """StrategyError when the graph has an operator this executor cannot run."""
    bad = sorted({n.kind.value for n in graph.nodes if n.kind not in SUPPORTED})
    if bad:
        raise StrategyError(f"the ILP-plan executor cannot run operators of kind {', '.join(bad)}")


def strategies_from_plan(plan: Mapping[str, Any], graph: Graph) -> dict[str, dict[str, Any]]:
    """Every operator's strategy from an ILP plan document (``strategy.units[].ops`` name the
    operators of each group's representative unit; the other units of a group take the same
    strategy at the same position)."""
    strategy = plan.get("strategy") or {}
    if strategy.get("kind") != "intra-operator":
        raise StrategyError("not an ILP plan (strategy.kind is not 'intra-operator')")
    names = list((strategy.get("mesh") or {}).get("axes") or {})
    by_rep: dict[str, dict[str, Any]] = {}
    for group in strategy.get("units") or []:
        for op, entry in (group.get("ops") or {}).items():
            if "assignment" in entry:
                assignment = [entry["assignment"].get(a) for a in names]
                by_rep[op] = {"assignment": assignment, "zero": int(entry.get("zero", 0))}
    rep_of = GraphCosts(graph).node_representatives(structural=True)  # as the ILP shares its variables
    out: dict[str, dict[str, Any]] = {}
    for n in graph.nodes:
        if n.is_leaf:
            continue
        rep = rep_of[n.id]
        if rep in by_rep:
            out[n.id] = by_rep[rep]
            continue
        names_of = renaming(graph, n)
        producer = out.get(n.inputs[0]) if n.inputs else None
        if names_of is None or producer is None:
            raise StrategyError(f"the plan gives no strategy for operator {n.id} (representative {rep})")
        # a view that only renames dims follows its producer's layout (the ILP gives it no variables)
        out[n.id] = {"assignment": [names_of.get(d, d) if d is not None else None for d in producer["assignment"]],
                     "zero": 0}
    return out


# ---------------------------------------------------------------------- layouts and placements

def placements(layout: TensorLayout, node: Node, mesh: Mesh) -> list[Any]:
    """DTensor placements (one per mesh axis) of ``node``'s tensor in ``layout``."""
    dims = [d for d, _ in node.dims]
    out: list[Any] = [Replicate() for _ in mesh.names]
    for d, axes in layout.split:
        for a in axes:
            out[mesh.names.index(a)] = Shard(dims.index(d))
    for a in layout.partial:
        out[mesh.names.index(a)] = Partial()
    return out


def parameter_layout(graph: Graph, owner: Node, position: int, s: OpStrategy, mesh: Mesh) -> TensorLayout:
    """Where a parameter lives: its owner's layout, plus (ZeRO-3) a split over the data axes on the
    first dim that still divides."""
    lay = input_layout(owner, position, graph, s, mesh)
    if s.zero < 3:
        return lay
    param = graph.node(owner.inputs[position])
    split = {d: list(a) for d, a in lay.split}
    sizes = mesh.sizes
    for axis in data_axes(s, mesh):
        for d, size in param.dims:
            have = math.prod(sizes[a] for a in split.get(d, []))
            if size % (have * sizes[axis]) == 0:
                split.setdefault(d, []).append(axis)
                break
    ordered = {d: sorted(a, key=mesh.names.index) for d, a in split.items()}
    return TensorLayout.of(ordered, lay.partial)


# ---------------------------------------------------------------------- the interpreter

def _letters(names: list[str]) -> dict[str, str]:
    return {n: "abcdefghijklmnopqrstuvwxyz"[i] for i, n in enumerate(dict.fromkeys(names))}


def _einsum(node: Node, ins: list[torch.Tensor], graph: Graph) -> torch.Tensor:
    operands = [[d for d, _ in graph.node(i).dims] for i in node.inputs]
    result = [d for d, _ in node.dims]
    if len(ins) == 2:
        y = _as_matmul(ins[0], ins[1], operands[0], operands[1], result)
        if y is not None:
            return y
    letter = _letters([d for ds in operands for d in ds] + result)
    eq = ",".join("".join(letter[d] for d in ds) for ds in operands) + "->" + "".join(letter[d] for d in result)
    return torch.einsum(eq, *ins)


def _as_matmul(a: torch.Tensor, b: torch.Tensor, adims: list[str], bdims: list[str],
               rdims: list[str]) -> torch.Tensor | None:
    """A linear layer's einsum as one matmul of views (what a framework's linear does: it keeps
    its input and weight, not permuted copies), or None when the dims are not in that order."""
    contracted = [d for d in adims if d in bdims and d not in rdims]
    a_free = [d for d in adims if d not in contracted]
    b_free = [d for d in bdims if d not in contracted]
    if not contracted or rdims != a_free + b_free or adims[len(a_free):] != contracted:
        return None
    k = math.prod(a.shape[len(a_free):])
    if bdims[:len(contracted)] == contracted:
        w = b.reshape(k, -1)
    elif bdims[len(b_free):] == contracted:
        w = b.reshape(-1, k).t()
    else:
        return None
    y = a.reshape(*a.shape[:len(a_free)], k) @ w
    return y.reshape(*a.shape[:len(a_free)], *[b.shape[bdims.index(d)] for d in b_free])


def _elementwise(node: Node, ins: list[torch.Tensor], graph: Graph) -> torch.Tensor:
    """Inputs broadcast by name. ``scale`` multiplies by ``attrs.factor`` (1 when the graph does
    not record the number, as the tracer does not)."""
    try:
        return graph_ops.elementwise(str(node.attrs.get("fn")), ins, [graph_ops.dims_of(graph.node(i))
                                                                      for i in node.inputs],
                                     graph_ops.dims_of(node), float(node.attrs.get("factor", 1.0)))
    except StrategyError as e:
        raise StrategyError(f"{node.id}: {e}") from None


def _attention(node: Node, ins: list[torch.Tensor], q_offset: int, dropout: bool) -> torch.Tensor:
    """Causal attention of the local queries (rows ``q_offset ..``) over the whole key sequence,
    with PyTorch's fused kernel (no scores kept). Attention dropout is not applied: the fused CPU
    kernel has none (the other dropouts are)."""
    q, k, v = (t.transpose(1, 2) for t in ins)
    causal = bool(node.attrs.get("causal"))
    gqa = q.shape[1] != k.shape[1]
    if causal and (q_offset or q.shape[2] != k.shape[2]):
        rows = torch.arange(q.shape[2]).unsqueeze(1) + q_offset
        mask = torch.arange(k.shape[2]).unsqueeze(0) <= rows
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
    else:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    return out.transpose(1, 2)


class _RMSNorm(torch.autograd.Function):
    """``x · rsqrt(mean(x²) + eps) · w`` keeping ``x`` and ``rstd`` (not ``x·rstd``) for backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, w, rstd)
        return x * rstd * w

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, w, rstd = ctx.saved_tensors
        normed = x * rstd
        gw = (grad * normed).sum(dim=tuple(range(grad.dim() - 1)))
        gn = grad * w
        gx = rstd * (gn - normed * (gn * normed).mean(-1, keepdim=True))
        return gx, gw, None


def _embedding(ids: torch.Tensor, weight: torch.Tensor, row_offset: int, rows_total: int) -> torch.Tensor:
    """Rows of the local slice of the table (others are zero: partial sums over the vocabulary split)."""
    if weight.shape[0] == rows_total:
        return F.embedding(ids, weight)
    local = ids - row_offset
    inside = (local >= 0) & (local < weight.shape[0])
    return F.embedding(local.clamp(0, weight.shape[0] - 1), weight) * inside.unsqueeze(-1).to(weight.dtype)


def _cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-token loss; the classes are the logits' last dim (the builder's and the tracer's order)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)


class PlanInterpreter:
    """The graph as a function of its parameters and inputs, on one rank (plain tensors when
    ``mesh`` is None: the single-process reference).

    Every operator computes on its inputs' local shards, in the layouts its strategy gives them:
    those shards are exactly the operator's local work (the strategy splits every input by the
    dims its axes split), so the local result is the output's local shard in the strategy's output
    layout, partial sums included. DTensor carries the layouts between operators and does the
    resharding."""

    def __init__(self, graph: Graph, strategies: Mapping[str, dict[str, Any]] | None, mesh: Mesh | None,
                 device_mesh: Any = None) -> None:
        check_graph(graph)
        self.graph = graph
        self.mesh = mesh
        self.dm = device_mesh
        self.strategy: dict[str, OpStrategy] = {
            op: OpStrategy(tuple(v["assignment"]), int(v.get("zero", 0))) for op, v in (strategies or {}).items()}
        self.partial = {n.id: loop_dims(n, graph)[1] for n in graph.nodes if not n.is_leaf}
        self.owner: dict[str, tuple[Node, int]] = {}
        for n in graph.nodes:
            for pos, i in enumerate(n.inputs):
                if graph.node(i).is_parameter and i not in self.owner:
                    self.owner[i] = (n, pos)
        self.vocab = next((s for n in graph.nodes if n.is_parameter for d, s in n.dims if d == "vocab"), 0)
        #: MoE routing of the current forward pass, per router-probabilities node
        self.routes: dict[str, moe_exec.Routing] = {}

    @property
    def distributed(self) -> bool:
        return self.dm is not None and self.mesh is not None

    # ------------------------------------------------------------------ tensors
    def _to(self, t: Any, node: Node, layout: TensorLayout) -> Any:
        assert self.mesh is not None
        want = placements(layout, node, self.mesh)
        if tuple(t.placements) == tuple(want):
            return t
        if self.dm.device_type == "cpu":  # gloo: DTensor has no all-to-all there (see .alltoall)
            swapped = all_to_all_redistribute(t, want)
            if swapped is not None:
                return swapped
        return t.redistribute(self.dm, want)

    def distribute(self, node: Node, full: torch.Tensor, layout: TensorLayout) -> Any:
        """A full tensor (equal on every rank) cut to ``layout``."""
        if not self.distributed:
            return full
        assert self.mesh is not None
        return distribute_tensor(full, self.dm, placements(layout, node, self.mesh))

    def _offset(self, t: Any, dim: int) -> int:
        """Global index of this rank's first element along ``dim`` of a DTensor."""
        if not self.distributed:
            return 0
        _, offset = compute_local_shape_and_global_offset(t.shape, self.dm, t.placements)
        return int(offset[dim])

    def parameters(self, seed: int) -> dict[str, Any]:
        """Every parameter, initialised from ``seed`` and its name (equal in every run), in its layout."""
        out = {}
        for n in self.graph.nodes:
            if not n.is_parameter:
                continue
            g = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(n.id.encode()))
            shape = [s for _, s in n.dims]
            if n.id.endswith(".bias"):
                full = torch.zeros(shape)
            elif n.id.endswith(("norm.weight", "ln1.weight", "ln2.weight")) or len(shape) == 1:
                full = torch.ones(shape)
            else:
                full = torch.randn(shape, generator=g) * 0.02
            if self.mesh is None:
                out[n.id] = full
                continue
            owner, pos = self.owner[n.id]
            lay = parameter_layout(self.graph, owner, pos, self.strategy[owner.id], self.mesh)
            out[n.id] = self.distribute(n, full, lay)
        return out

    def inputs(self, seed: int) -> dict[str, torch.Tensor]:
        """Token ids, position ids and labels (full tensors, equal on every rank)."""
        g = torch.Generator().manual_seed(seed + 7)
        out: dict[str, torch.Tensor] = {}
        for n in self.graph.nodes:
            if n.kind is not OpKind.INPUT:
                continue
            shape = [s for _, s in n.dims]
            if n.id == "position_ids":  # 0 .. seq-1 along the sequence, for every sample
                seq = dict(n.dims).get("seq", shape[-1])
                out[n.id] = torch.arange(seq).expand(*shape[:-1], seq).contiguous() if len(shape) > 1 else \
                    torch.arange(seq)
            elif not n.dtype.startswith("int"):  # a traced graph's tables and masks
                out[n.id] = graph_ops.synthetic_input(n, self.vocab, seed)
            else:
                out[n.id] = torch.randint(0, self.vocab, shape, generator=g)
        return out

    def _locals(self, n: Node, s: OpStrategy | None, dist_ins: list[Any]) -> list[torch.Tensor]:
        """The inputs' local shards. Along an axis that divides the operator's work but not an
        input, each device's gradient of that input covers only its part of the work: a partial
        sum (the data-parallel gradient reduction, for a weight split over the batch)."""
        if not self.distributed:
            return dist_ins
        working: set[int] = set()
        for t in dist_ins:
            working |= {i for i, p in enumerate(t.placements) if not isinstance(p, Replicate)}
        out = []
        for t in dist_ins:
            if not t.requires_grad:
                out.append(t.to_local())
                continue
            grads = [Partial() if i in working and isinstance(p, Replicate) else p for i, p in enumerate(t.placements)]
            out.append(t.to_local(grad_placements=grads))
        return out

    # ------------------------------------------------------------------ one forward pass
    def loss(self, params: Mapping[str, Any], inputs: Mapping[str, torch.Tensor], dropout: bool) -> Any:
        """Mean per-token loss of the micro-step (a scalar; a DTensor on the mesh)."""
        graph, mesh = self.graph, self.mesh
        self.routes = {}
        values: dict[str, Any] = dict(params)
        last_use: dict[str, int] = {}
        for idx, n in enumerate(graph.nodes):
            for i in n.inputs:
                last_use[i] = idx
        out: Any = None
        for idx, n in enumerate(graph.nodes):
            if n.is_leaf:
                continue
            s = self.strategy.get(n.id)
            raw: list[Any] = []
            layouts: list[TensorLayout] = []
            for pos, i in enumerate(n.inputs):
                src = graph.node(i)
                lay = input_layout(n, pos, graph, s, mesh) if s is not None and mesh is not None else TensorLayout()
                if n.kind is OpKind.CROSS_ENTROPY and pos == 0 and mesh is not None:
                    # the vocabulary stays whole per device (the softmax is computed locally)
                    cdim = str(n.attrs.get("class_dim", "vocab"))
                    lay = TensorLayout(tuple((d, a) for d, a in lay.split if d != cdim), lay.partial)
                layouts.append(lay)
                if src.kind is OpKind.INPUT:
                    raw.append(self.distribute(src, inputs[i], lay))
                elif src.is_parameter or not self.distributed:
                    raw.append(values[i])
                else:
                    raw.append(self._to(values[i], src, lay))
            gathers = self.distributed and any(
                graph.node(i).is_parameter and tuple(raw[pos].placements) != tuple(
                    placements(layouts[pos], graph.node(i), mesh))  # type: ignore[arg-type]
                for pos, i in enumerate(n.inputs))

            def run(*args: Any, n: Node = n, s: OpStrategy | None = s, layouts: list[TensorLayout] = layouts) -> Any:
                dist_ins = [self._to(a, graph.node(i), lay) if self.distributed and graph.node(i).is_parameter else a
                            for a, i, lay in zip(args, n.inputs, layouts, strict=True)]
                return self._compute(n, s, dist_ins, dropout)

            if gathers and torch.is_grad_enabled():
                # ZeRO-3: the gathered weights are not kept for backward but gathered again there
                # (what FSDP does); the op's other inputs are what it keeps
                for a, i in zip(raw, n.inputs, strict=True):
                    if not graph.node(i).is_parameter and isinstance(a, torch.Tensor):
                        mark_activation(a.to_local() if hasattr(a, "to_local") else a)
                y = checkpoint(run, *raw, use_reentrant=False)
            else:
                y = run(*raw)
            values[n.id] = y
            out = y
            # a tensor is dropped after its last reader, as an eager program drops it
            for i in n.inputs:
                if last_use.get(i) == idx and not graph.node(i).is_parameter:
                    values.pop(i, None)
            del raw, y
        return out.mean()

    def _compute(self, n: Node, s: OpStrategy | None, dist_ins: list[Any], dropout: bool) -> Any:
        """One operator on its inputs (already in its strategy's layouts): local compute, then
        the result declared in the strategy's output layout."""
        graph, mesh = self.graph, self.mesh
        ins = self._locals(n, s, dist_ins)
        k = n.kind
        if k is OpKind.EINSUM:
            y = _einsum(n, ins, graph)
        elif k is OpKind.ELEMENTWISE:
            y = _elementwise(n, ins, graph)
        elif k is OpKind.DROPOUT:
            p = float(n.attrs.get("p", 0.0))
            # native_dropout: the GPU path of F.dropout, with its 1-byte mask, on any device
            y = torch.native_dropout(ins[0], p, True)[0] if dropout and p > 0 else ins[0]
        elif k is OpKind.LAYERNORM:
            if n.dims[-1][0] != str(n.attrs.get("dim")):
                raise StrategyError(f"{n.id}: LayerNorm over a dim that is not the last")
            y = F.layer_norm(ins[0], (ins[0].shape[-1],), ins[1], ins[2] if len(ins) > 2 else None)
        elif k is OpKind.RMSNORM:
            if n.dims[-1][0] != str(n.attrs.get("dim")):
                raise StrategyError(f"{n.id}: RMSNorm over a dim that is not the last")
            y = _RMSNorm.apply(ins[0], ins[1], float(n.attrs.get("eps", 1e-5)))  # type: ignore[no-untyped-call]
        elif k is OpKind.ATTENTION:
            y = self._attention(n, ins, dist_ins, dropout)
        elif k is OpKind.EMBEDDING:
            y = _embedding(ins[0], ins[1], self._offset(dist_ins[1], 0), graph.node(n.inputs[1]).dims[0][1])
        elif k is OpKind.CROSS_ENTROPY:
            y = _cross_entropy(ins[0], ins[1])
        elif k is OpKind.SOFTMAX:
            y = graph_ops.softmax(ins[0], n)
        elif k is OpKind.RESHAPE:
            y = graph_ops.reshape(ins[0], graph.node(n.inputs[0]), n)
        elif k is OpKind.REDUCE:
            y = graph_ops.reduce(ins[0], graph.node(n.inputs[0]), n)
        elif k is OpKind.CONCAT:
            y = graph_ops.concat(ins, [graph.node(i) for i in n.inputs], n)
        else:  # dispatch, combine
            y = self._moe(n, s, ins, dist_ins)
        if not self.distributed:
            return y
        assert s is not None and mesh is not None
        lay = output_layout(n, s, mesh, self.partial[n.id])
        if k is OpKind.CROSS_ENTROPY:
            cdim = str(n.attrs.get("class_dim", "vocab"))
            lay = TensorLayout(tuple((d, a) for d, a in lay.split if d != cdim), lay.partial)
        return DTensor.from_local(y, self.dm, placements(lay, n, mesh), run_check=False)


    def _attention(self, n: Node, ins: list[torch.Tensor], dist_ins: list[Any], dropout: bool) -> torch.Tensor:
        """By name when k has q's head dims (a traced graph), else the builder's layout."""
        graph = self.graph
        q_node, k_node, v_node = (graph.node(i) for i in n.inputs[:3])
        mask = None
        if len(ins) > 3:
            qd = graph_ops.dims_of(q_node)
            offsets = {d: self._offset(dist_ins[0], i) for i, d in enumerate(qd)}
            local = {d: int(ins[0].shape[i]) for i, d in enumerate(qd)}
            mask = graph_ops.mask_for(ins[3], graph.node(n.inputs[3]), q_node, offsets, local)
        y = graph_ops.attention_by_name(n, q_node, k_node, v_node, ins, mask)
        if y is not None:
            return y
        if mask is not None:
            raise StrategyError(f"{n.id}: a mask input with grouped key heads is not executed")
        return _attention(n, ins, self._offset(dist_ins[0], 1), dropout)

    def _moe(self, n: Node, s: OpStrategy | None, ins: list[torch.Tensor], dist_ins: list[Any]) -> torch.Tensor:
        """``dispatch`` / ``combine`` (:mod:`.moe_exec`); expert parallelism over the one mesh axis
        the strategy gives ``expert`` (no other split of these operators is executed)."""
        graph = self.graph
        group = None
        if self.distributed and s is not None:
            assert self.mesh is not None
            axes = [i for i, d in enumerate(s.assignment) if d is not None]
            if any(s.assignment[i] != "expert" for i in axes) or len(axes) > 1:
                raise StrategyError(f"{n.id}: only expert parallelism over one mesh axis is executed for "
                                    f"dispatch and combine, not {s.describe(self.mesh)}")
            if axes and self.dm.size(axes[0]) > 1:
                group = self.dm.get_group(axes[0])
                tokens_in = dist_ins[0] if n.kind is OpKind.DISPATCH else dist_ins[1]
                first = tokens_in.placements[axes[0]]
                if not (isinstance(first, Shard) and first.dim == 0):
                    raise StrategyError(f"{n.id}: expert parallelism needs the tokens split along their first dim")
        probs_node = graph.node(n.inputs[1])
        token_dims = graph_ops.dims_of(probs_node)[:-1]
        probs = ins[1].reshape(-1, ins[1].shape[-1])
        if n.kind is OpKind.DISPATCH:
            x_node = graph.node(n.inputs[0])
            feature = n.dims[2][0]
            x = graph_ops.align(ins[0], graph_ops.dims_of(x_node), [*token_dims, feature])
            routing = moe_exec.route(probs, int(n.attrs.get("top_k", 1)), n.dims[1][1], group)
            self.routes[probs_node.id] = routing
            return moe_exec.dispatch(x.reshape(-1, x.shape[-1]), routing, group)
        routing = self.routes.get(probs_node.id) or moe_exec.route(
            probs, self._top_k(probs_node.id), graph.node(n.inputs[0]).dims[1][1], group)
        tokens = ins[1].shape[:-1]
        y = moe_exec.combine(ins[0], probs, routing, group, int(math.prod(tokens)))
        y = y.view(*tokens, y.shape[-1])
        order = [*token_dims, n.dims[-1][0]]
        return y.permute(*[order.index(d) for d in graph_ops.dims_of(n)])

    def _top_k(self, probs_id: str) -> int:
        return next(int(m.attrs.get("top_k", 1)) for m in self.graph.nodes
                    if m.kind is OpKind.DISPATCH and m.inputs[1] == probs_id)


class ParameterHolder(nn.Module):
    """The parameters as one module (for the optimizer and the memory tracker)."""

    def __init__(self, params: Mapping[str, Any]) -> None:
        super().__init__()
        self.names = list(params)
        self.store = nn.ParameterList([nn.Parameter(p) for p in params.values()])

    def as_dict(self) -> dict[str, Any]:
        return dict(zip(self.names, self.store, strict=True))


# ---------------------------------------------------------------------- one rank's run

def reference_loss_and_grads(spec: IlpRunSpec) -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and gradients of the micro-step in one process, plain tensors, dropout off."""
    graph = spec.graph()
    ref = PlanInterpreter(graph, None, None)
    holder = ParameterHolder(ref.parameters(spec.seed))
    loss = ref.loss(holder.as_dict(), ref.inputs(spec.seed), dropout=False)
    loss.backward()
    return float(loss.item()), {n: p.grad.detach().clone() for n, p in holder.as_dict().items() if p.grad is not None}


def run_ilp_spec(spec: IlpRunSpec, device: torch.device) -> dict[str, Any]:
    """On this rank (inside a process group of ``spec.world`` ranks): a correctness check against
    the single-process reference, one warm-up step, then one measured training step (forward,
    backward, Adam) under the category tracker."""
    if dist.get_world_size() != spec.world:
        raise StrategyError(f"the plan's mesh has {spec.world} devices but the process group {dist.get_world_size()}")
    graph = spec.graph()
    mesh = Mesh(tuple((f"m{i}", s) for i, s in enumerate(spec.mesh)))
    dm = init_device_mesh(device.type, tuple(spec.mesh), mesh_dim_names=mesh.names)
    runner = PlanInterpreter(graph, spec.strategies, mesh, dm)
    holder = ParameterHolder(runner.parameters(spec.seed))
    inputs = runner.inputs(spec.seed)
    # correctness: step-1 loss and every gradient against one process, dropout off
    loss = runner.loss(holder.as_dict(), inputs, dropout=False)
    loss.backward()
    ref_loss, ref_grads = reference_loss_and_grads(spec)
    got_loss = float((loss.full_tensor() if hasattr(loss, "full_tensor") else loss).item())
    mismatches = []
    worst = 0.0
    for name, p in holder.as_dict().items():
        g = p.grad.full_tensor() if p.grad is not None else torch.zeros_like(ref_grads[name])
        worst = max(worst, float((g - ref_grads[name]).abs().max()))
        if not torch.allclose(g, ref_grads[name], rtol=1e-4, atol=1e-6):
            mismatches.append(name)
    check = {"ok": not mismatches and math.isclose(got_loss, ref_loss, rel_tol=1e-5), "loss": got_loss,
             "reference_loss": ref_loss, "max_abs_grad_diff": worst, "mismatches": mismatches,
             "parameters_compared": len(ref_grads), "rtol": 1e-4, "atol": 1e-6}
    optimizer = torch.optim.Adam(holder.parameters(), lr=1e-3, foreach=False)

    def step() -> None:
        optimizer.zero_grad(set_to_none=False)
        runner.loss(holder.as_dict(), inputs, dropout=True).backward()
        optimizer.step()

    step()  # warm-up: gradients and optimizer states exist from here on
    dist.barrier()
    tracker = CategoryTracker(diagnose=spec.diagnose)
    tracker.register_state([holder], [optimizer])
    with tracker.measuring():
        step()
    measured = tracker.result(device)
    if spec.diagnose:
        measured["contents"] = {k: summarise_contents(v) for k, v in tracker.peak_contents.items()}
    return {"rank": dist.get_rank(), "label": spec.label, "device": device.type, "check": check,
            "measured": measured}


def run_ilp_specs(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Worker entry point: every spec in turn on this rank."""
    device = device_for_rank()
    out = []
    for d in specs:
        out.append(run_ilp_spec(IlpRunSpec(**d), device))
        dist.barrier()
    return out

"""The interpreter of an ILP plan: the operator graph as a function of its parameters and inputs
on one rank, each operator on DTensors in the layouts its strategy gives them (:mod:`.ilp_exec`
tells the whole scheme), and the layouts as DTensor placements."""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - PyTorch's convention
from torch import nn
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torch.utils.checkpoint import checkpoint

from parplan.agent import graph_ops, local_ops, moe_exec
from parplan.agent.alltoall import all_to_all_redistribute
from parplan.agent.memtrack import mark_activation
from parplan.solver.cost.layout import TensorLayout
from parplan.solver.errors import StrategyError
from parplan.solver.ilp.strategies import Mesh, OpStrategy, data_axes, input_layout, loop_dims, output_layout
from parplan.solver.ir import Graph, Node, OpKind

SUPPORTED = frozenset({OpKind.INPUT, OpKind.PARAMETER, OpKind.EINSUM, OpKind.ELEMENTWISE, OpKind.DROPOUT,
                       OpKind.LAYERNORM, OpKind.RMSNORM, OpKind.ATTENTION, OpKind.EMBEDDING,
                       OpKind.CROSS_ENTROPY, OpKind.SOFTMAX, OpKind.RESHAPE, OpKind.REDUCE, OpKind.CONCAT,
                       OpKind.DISPATCH, OpKind.COMBINE})


def check_graph(graph: Graph) -> None:
    """StrategyError when the graph has an operator this executor cannot run."""
    bad = sorted({n.kind.value for n in graph.nodes if n.kind not in SUPPORTED})
    if bad:
        raise StrategyError(f"the ILP-plan executor cannot run operators of kind {', '.join(bad)}")


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
            y = local_ops.einsum(n, ins, graph)
        elif k is OpKind.ELEMENTWISE:
            y = local_ops.elementwise(n, ins, graph)
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
            y = local_ops.RMSNormFunction.apply(ins[0], ins[1], float(n.attrs.get("eps", 1e-5)))  # type: ignore[no-untyped-call]
        elif k is OpKind.ATTENTION:
            y = self._attention(n, ins, dist_ins, dropout)
        elif k is OpKind.EMBEDDING:
            y = local_ops.embedding(ins[0], ins[1], self._offset(dist_ins[1], 0), graph.node(n.inputs[1]).dims[0][1])
        elif k is OpKind.CROSS_ENTROPY:
            y = local_ops.cross_entropy(ins[0], ins[1])
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
        return local_ops.causal_attention(n, ins, self._offset(dist_ins[0], 1), dropout)

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

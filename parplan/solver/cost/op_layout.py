"""How an operator is laid out on a device mesh: which mesh axes split which of its dims.

A strategy maps every mesh axis to one of the operator's *loop dims* or to nothing (replicated
along that axis); one dim may take several axes (``S01``). Splitting a dim that the output lacks
(an einsum's contracted dim, an embedding's vocabulary) leaves *partial sums* on that axis. Input
layouts follow from the strategy: an input is split by an axis when it has the axis's dim, and is
replicated along it otherwise. Operators that cannot split a dim (softmax over it, a norm over
it, attention's head dim and key sequence) never assign an axis to it.

The ILP chooses a strategy per operator (:mod:`parplan.solver.ilp.strategies`); a uniform
(Megatron-LM style) strategy is one assignment for every operator (:func:`uniform_assignment`),
which the whole-plan evaluator prices with the same layouts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from parplan.solver.cost.layout import TensorLayout
from parplan.solver.ir import Graph, Node, OpKind, attention_dims, parse_equation
from parplan.solver.strategy import CP_DIMS, SEQ_DIMS, TP_DIMS

#: Dim names treated as the batch (data-parallel) dims.
BATCH_DIMS = frozenset({"batch"})


@dataclass(frozen=True)
class Mesh:
    """A logical device mesh: named axes with sizes, outermost first (row-major device ids)."""

    axes: tuple[tuple[str, int], ...]

    @cached_property
    def names(self) -> tuple[str, ...]:
        return tuple(a for a, _ in self.axes)

    @cached_property
    def sizes(self) -> dict[str, int]:
        """Axis -> size (one dict per mesh, made once: read it, never change it)."""
        return dict(self.axes)

    @property
    def num_devices(self) -> int:
        return math.prod(s for _, s in self.axes)

    def describe(self) -> str:
        return "x".join(str(s) for _, s in self.axes)


@dataclass(frozen=True)
class OpStrategy:
    """One strategy of one operator: the dim each mesh axis splits (None: replicated)."""

    assignment: tuple[str | None, ...]  # per mesh axis, in mesh order
    zero: int = 0  # ZeRO stage for the parameters the operator owns (over its data axes)

    def axes_of(self, mesh: Mesh, dim: str) -> tuple[str, ...]:
        return tuple(a for a, d in zip(mesh.names, self.assignment, strict=True) if d == dim)

    def describe(self, mesh: Mesh) -> str:
        parts = [f"{d}:{a}" for a, d in zip(mesh.names, self.assignment, strict=True) if d is not None]
        text = " ".join(parts) or "replicated"
        return text + (f" zero{self.zero}" if self.zero else "")


def loop_dims(node: Node, graph: Graph) -> tuple[dict[str, int], frozenset[str]]:
    """(splittable dims with sizes, dims whose split leaves partial sums) of an operator;
    remembered on the graph for its own operators."""
    if not graph.owns(node):
        return _loop_dims(node, graph)
    cache = graph.memo.setdefault("loop_dims", {})
    hit = cache.get(node.id)
    if hit is None:
        hit = cache[node.id] = _loop_dims(node, graph)
    return dict(hit[0]), hit[1]


def _loop_dims(node: Node, graph: Graph) -> tuple[dict[str, int], frozenset[str]]:
    ins = [graph.node(i) for i in node.inputs]
    out = node.shape
    k = node.kind
    if k is OpKind.EINSUM:
        operands, result = parse_equation(str(node.attrs["equation"]))
        sizes: dict[str, int] = {}
        for names, inp in zip(operands, ins, strict=True):
            sizes.update({d: inp.shape[d] for d in names})
        return sizes, frozenset(d for d in sizes if d not in result)
    if k is OpKind.EMBEDDING:
        index_dim = str(node.attrs.get("index_dim", "vocab"))
        return {**out, index_dim: ins[1].shape[index_dim]}, frozenset({index_dim})
    if k is OpKind.ATTENTION:
        head_dim, _ = attention_dims(node, ins[0], ins[1])
        return {d: s for d, s in ins[0].shape.items() if d != head_dim}, frozenset()
    if k in (OpKind.SOFTMAX, OpKind.LAYERNORM, OpKind.RMSNORM):
        fixed = str(node.attrs.get("dim"))
        return {d: s for d, s in out.items() if d != fixed}, frozenset()
    if k is OpKind.CROSS_ENTROPY:
        cdim = str(node.attrs.get("class_dim", "vocab"))
        return {**out, cdim: ins[0].shape[cdim]}, frozenset()
    if k is OpKind.REDUCE:
        return dict(out), frozenset()
    if k is OpKind.CONCAT:
        cdim = str(node.attrs.get("dim"))
        return {d: s for d, s in out.items() if d != cdim}, frozenset()
    if k is OpKind.RESHAPE:
        src = ins[0].shape
        return {d: s for d, s in out.items() if src.get(d) == s}, frozenset()
    if k is OpKind.DISPATCH:
        return dict(out), frozenset()
    if k is OpKind.COMBINE:
        # Splitting the experts means the expert outputs come back to their tokens' owners.
        return {**out, "expert": ins[0].shape["expert"]}, frozenset()
    # elementwise, dropout: every dim of the output
    return dict(out), frozenset()


def output_layout(node: Node, s: OpStrategy, mesh: Mesh, partial_dims: frozenset[str]) -> TensorLayout:
    """Layout of the operator's output under ``s`` (partial axes for split contracted dims)."""
    split: dict[str, list[str]] = {}
    partial: list[str] = []
    out_dims = node.shape
    for axis, d in zip(mesh.names, s.assignment, strict=True):
        if d is None:
            continue
        if node.kind is OpKind.COMBINE and d == "expert":
            d = "batch"  # expert parallelism: tokens return to the devices that own them
        if d in partial_dims:
            partial.append(axis)
        elif d in out_dims:
            split.setdefault(d, []).append(axis)
    return TensorLayout.of(split, partial)


def input_layout(node: Node, position: int, graph: Graph, s: OpStrategy, mesh: Mesh) -> TensorLayout:
    """Layout the operator needs for input ``position`` under ``s``; remembered on the graph for
    its own operators."""
    if not graph.owns(node):
        return _input_layout(node, position, graph, s, mesh)
    cache = graph.memo.setdefault("input_layout", {})
    key = (node.id, position, s.assignment, mesh.names)
    hit = cache.get(key)
    if hit is None:
        hit = cache[key] = _input_layout(node, position, graph, s, mesh)
    return hit  # type: ignore[no-any-return]


def _input_layout(node: Node, position: int, graph: Graph, s: OpStrategy, mesh: Mesh) -> TensorLayout:
    inp = graph.node(node.inputs[position])
    dims = inp.shape
    if node.kind is OpKind.ATTENTION and position in (1, 2):
        mapping = _kv_mapping(node, graph)
        kv_split: dict[str, list[str]] = {}
        for axis, d in zip(mesh.names, s.assignment, strict=True):
            if d in mapping:
                kv_split.setdefault(mapping[d], []).append(axis)
        return TensorLayout.of(kv_split)
    if node.kind is OpKind.ATTENTION and position == 3:
        return TensorLayout()
    tokens_follow_experts = (node.kind is OpKind.DISPATCH) or (node.kind is OpKind.COMBINE and position == 1)
    split: dict[str, list[str]] = {}
    for axis, d in zip(mesh.names, s.assignment, strict=True):
        if d == "expert" and tokens_follow_experts and "batch" in dims:
            d = "batch"  # expert parallelism: each device keeps its own tokens; the op does an all-to-all
        if d is not None and d in dims:
            split.setdefault(d, []).append(axis)
    return TensorLayout.of(split)


def _kv_mapping(node: Node, graph: Graph) -> dict[str, str]:
    """Query dims whose split also splits the keys/values, and the key dim they split: batch and
    heads (grouped-query key heads follow the query heads); a query-sequence split needs the whole
    key sequence, so it splits nothing of k or v."""
    q, k = graph.node(node.inputs[0]), graph.node(node.inputs[1])
    head_dim, kv_seq = attention_dims(node, q, k)
    qd, kd = q.shape, k.shape
    mapping = {d: d for d in qd if d in kd and d not in (head_dim, kv_seq)}
    q_rest = [d for d in qd if d not in kd and d != head_dim]
    k_rest = [d for d in kd if d not in qd and d not in (head_dim, kv_seq)]
    if len(k_rest) == 1 and q_rest:
        heads = [d for d in q_rest if "head" in d]
        mapping[heads[0] if heads else q_rest[-1]] = k_rest[0]
    return mapping


def work_shards(s: OpStrategy, mesh: Mesh) -> int:
    """Devices the operator's arithmetic is divided over (axes assigned to some dim)."""
    return math.prod(size for (_, size), d in zip(mesh.axes, s.assignment, strict=True) if d is not None)


def partial_gradient_axes(node: Node, position: int, graph: Graph, s: OpStrategy, mesh: Mesh) -> frozenset[str]:
    """Mesh axes over which the gradient of activation input ``position`` comes out partial: the
    operator's work is split there, the input is not (a column-parallel linear's input)."""
    src = graph.node(node.inputs[position])
    if src.is_parameter or src.kind is OpKind.INPUT:
        return frozenset()
    lay = input_layout(node, position, graph, s, mesh)
    sizes = mesh.sizes
    return frozenset(a for a, d in zip(mesh.names, s.assignment, strict=True)
                     if d is not None and a not in lay.axes and sizes[a] > 1)


def data_axes(s: OpStrategy, mesh: Mesh) -> tuple[str, ...]:
    return tuple(a for a, d in zip(mesh.names, s.assignment, strict=True) if d in BATCH_DIMS)


def uniform_assignment(node: Node, graph: Graph, mesh: Mesh, data_axis: str | None, tensor_axis: str | None,
                       sequence_parallel: bool, expert_axis: str | None = None,
                       context_axis: str | None = None) -> tuple[str | None, ...]:
    """The dim each mesh axis splits for ``node`` under a uniform (Megatron-LM style) strategy: the
    batch over the data axis; over the tensor axis attention heads, key/value heads, the MLP's
    hidden units or the vocabulary (with sequence parallelism the sequence of the operators those
    leave whole); the experts over the expert axis; the sequence (an expert's capacity where there
    is none) over the context axis."""
    dims, _ = loop_dims(node, graph)
    out: list[str | None] = []
    for axis in mesh.names:
        d: str | None = None
        if axis == data_axis:
            d = next((x for x in dims if x in BATCH_DIMS), None)
        elif axis == expert_axis:
            d = "expert" if "expert" in dims else None
        elif axis == context_axis:
            d = next((x for x in CP_DIMS if x in dims), None)
        elif axis == tensor_axis:
            d = next((x for x in TP_DIMS if x in dims), None)
            if d is None and sequence_parallel and node.kind is not OpKind.EMBEDDING:  # lookups read whole ids
                d = next((x for x in SEQ_DIMS if x in dims), None)
        out.append(d)
    return tuple(out)




def renaming(graph: Graph, node: Node) -> dict[str, str] | None:
    """For a view that only renames dims (same sizes, same order): input dim -> output dim."""
    if node.kind is not OpKind.RESHAPE or len(node.inputs) != 1:
        return None
    src = graph.node(node.inputs[0])
    if [s for _, s in src.dims] != [s for _, s in node.dims]:
        return None
    return {a: b for (a, _), (b, _) in zip(src.dims, node.dims, strict=True)}

"""Intra-operator strategies: which mesh axes split which named dims of an operator.

A strategy maps every mesh axis to one of the operator's *loop dims* or to nothing (replicated
along that axis); one dim may take several axes (``S01``). Splitting a dim that the output lacks
(an einsum's contracted dim, an embedding's vocabulary) leaves *partial sums* on that axis. Input
layouts follow from the strategy: an input is split by an axis when it has the axis's dim, and is
replicated along it otherwise. Operators that cannot split a dim (softmax over it, a norm over
it, attention's head dim and key sequence) never assign an axis to it. Splits must divide.

Parameters are priced with the operator that first reads them, including the ZeRO choices data
parallelism offers: over the *data axes* (axes splitting the batch but not the parameter) the
optimizer states (ZeRO-1), gradients (ZeRO-2) and weights (ZeRO-3) may be sharded.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from parplan.solver.cost.layout import TensorLayout
from parplan.solver.ir import Graph, Node, OpKind, attention_dims, parse_equation

#: Dim names treated as the batch (data-parallel) dims.
BATCH_DIMS = frozenset({"batch"})


@dataclass(frozen=True)
class Mesh:
    """A logical device mesh: named axes with sizes, outermost first (row-major device ids)."""

    axes: tuple[tuple[str, int], ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a for a, _ in self.axes)

    @property
    def sizes(self) -> dict[str, int]:
        return dict(self.axes)

    @property
    def num_devices(self) -> int:
        return math.prod(s for _, s in self.axes)

    def describe(self) -> str:
        return "x".join(str(s) for _, s in self.axes)


def mesh_shapes(num_devices: int, gpus_per_node: int, max_dims: int = 3) -> list[Mesh]:
    """Candidate meshes: 2-D ``[N/k, k]`` for ``k`` dividing the node (1-D ``[N]`` only when there is
    none: a 2-D mesh assigning both axes to one dim expresses every 1-D split); and, when the
    devices span several nodes, 3-D ``[N/(j·k), j, k]`` with ``j·k`` dividing the node (an
    inter-node axis and two intra-node ones; within one node two axes already express every split
    pattern the search uses). Axes are named ``m0, m1, m2`` outermost first, so the last axis stays
    inside a node."""
    out = [Mesh((("m0", num_devices),))]
    if max_dims >= 2:
        # a 2-D mesh splitting one dim over both axes is the 1-D mesh, with each axis on its own link
        out = []
        for k in range(2, min(gpus_per_node, num_devices) + 1):
            if gpus_per_node % k == 0 and num_devices % k == 0 and num_devices // k > 1:
                out.append(Mesh((("m0", num_devices // k), ("m1", k))))
    if max_dims >= 3 and num_devices > gpus_per_node:
        for j in range(2, gpus_per_node + 1):
            for k in range(2, gpus_per_node // j + 1):
                if gpus_per_node % (j * k) == 0 and num_devices % (j * k) == 0 and num_devices // (j * k) > 1:
                    out.append(Mesh((("m0", num_devices // (j * k)), ("m1", j), ("m2", k))))
    return out or [Mesh((("m0", num_devices),))]


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
    """(splittable dims with sizes, dims whose split leaves partial sums) of an operator."""
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


def enumerate_assignments(mesh: Mesh, dims: Mapping[str, int]) -> Iterator[tuple[str | None, ...]]:
    """Every map of mesh axes to dims (or None) whose splits divide the dims."""
    options: list[str | None] = [None, *dims]
    for combo in itertools.product(options, repeat=len(mesh.axes)):
        ok = True
        for d in dims:
            split = math.prod(s for (_, s), c in zip(mesh.axes, combo, strict=True) if c == d)
            if dims[d] % split:
                ok = False
                break
        if ok:
            yield combo


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
    """Layout the operator needs for input ``position`` under ``s``."""
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


def data_axes(s: OpStrategy, mesh: Mesh) -> tuple[str, ...]:
    return tuple(a for a, d in zip(mesh.names, s.assignment, strict=True) if d in BATCH_DIMS)


def valid_for(node: Node, graph: Graph, s: OpStrategy, mesh: Mesh, dims: Mapping[str, int]) -> bool:
    """Extra rules: grouped-query attention needs the key heads divisible by the head split."""
    if node.kind is OpKind.ATTENTION:
        k = graph.node(node.inputs[1]).shape
        lay = input_layout(node, 1, graph, s, mesh)
        sizes = mesh.sizes
        for d, axes in lay.split:
            if k[d] % math.prod(sizes[a] for a in axes):
                return False
    return True


def candidate_strategies(node: Node, graph: Graph, mesh: Mesh, owns_params: bool,
                         zero_stages: Sequence[int] = (0, 1, 2, 3)) -> list[OpStrategy]:
    """All strategies of ``node`` on ``mesh`` (with ZeRO variants when it owns parameters and
    splits the batch)."""
    dims, _ = loop_dims(node, graph)
    out: list[OpStrategy] = []
    for combo in enumerate_assignments(mesh, dims):
        base = OpStrategy(combo)
        if not valid_for(node, graph, base, mesh, dims):
            continue
        if owns_params and data_axes(base, mesh):
            out.extend(OpStrategy(combo, z) for z in zero_stages)
        else:
            out.append(base)
    return out

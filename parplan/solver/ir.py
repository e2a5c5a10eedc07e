"""Graph IR: operators producing tensors with *named* dimensions.

A :class:`Graph` is a DAG of :class:`Node` objects. Every node produces exactly one tensor,
described by its ordered named dims (``{"batch": 8, "seq": 2048, "hidden": 2304}``) and a
dtype. Edges are the node's ``inputs`` (ids of producer nodes, in argument order).
Leaves are ``input`` nodes (data fed to the model) and ``parameter`` nodes (trainable
weights). Operators say by their kind how output dims follow from input dims, which is
what :func:`parplan.solver.validate.validate_graph` checks.

Sizes are element counts; memory is computed by the cost model from dtype sizes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from parplan.solver.errors import ConfigError


class OpKind(StrEnum):
    """Operator kinds. The comment says the inputs (in order) and the rule for the output dims."""

    INPUT = "input"  # no inputs; data fed to the model (token ids, labels, image patches)
    PARAMETER = "parameter"  # no inputs; a trainable tensor
    EINSUM = "einsum"  # n inputs; attrs.equation "a b c, c d -> a b d" over dim names
    ELEMENTWISE = "elementwise"  # n inputs broadcast by name; attrs.fn (add, mul, gelu, silu, ...)
    DROPOUT = "dropout"  # x; same dims; attrs.p
    SOFTMAX = "softmax"  # x; same dims; attrs.dim is normalised over (cannot be split)
    LAYERNORM = "layernorm"  # x, weight[, bias]; same dims as x; attrs.dim (cannot be split)
    RMSNORM = "rmsnorm"  # x, weight; same dims as x; attrs.dim (cannot be split)
    EMBEDDING = "embedding"  # ids, table; ids dims + table dims without attrs.index_dim
    ATTENTION = "attention"  # q, k, v[, bias or sinks]; scaled dot-product attention; output dims of q (with
    # the value's head dim when it differs: value_head_dim); attrs.causal, .window (sliding), .sinks
    CROSS_ENTROPY = "cross_entropy"  # logits, labels; labels' dims; attrs.class_dim
    DISPATCH = "dispatch"  # MoE tokens x, gates; dims from attrs (expert, capacity, hidden)
    COMBINE = "combine"  # MoE expert outputs y, gates; dims of the gates without attrs.expert_dim + hidden
    RESHAPE = "reshape"  # x; any dims with the same number of elements
    REDUCE = "reduce"  # x; dims of x without attrs.over (attrs.op: sum, mean, first)
    CONCAT = "concat"  # n inputs joined along attrs.dim (sizes add up); other dims broadcast by name


#: Element sizes in bytes of the dtypes a node may declare.
DTYPE_BYTES: Mapping[str, int] = MappingProxyType(
    {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int64": 8, "int32": 4, "int8": 1, "bool": 1}
)

#: Elementwise functions the IR knows (their saved-for-backward tensors differ).
ELEMENTWISE_FNS = frozenset({"add", "sub", "mul", "scale", "gelu", "silu", "relu", "tanh", "sigmoid", "exp"})

Dims = tuple[tuple[str, int], ...]


def _freeze(attrs: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(attrs or {}))


@dataclass(frozen=True)
class Node:
    """One operator and the tensor it produces.

    ``dims`` is the ordered (name, size) list of the output tensor; ``layer`` tags nodes of
    one repeated block (e.g. ``"decoder.3"``) so searches can share decisions across blocks.
    """

    id: str
    kind: OpKind
    inputs: tuple[str, ...]
    dims: Dims
    dtype: str = "bf16"
    layer: str | None = None
    attrs: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def shape(self) -> dict[str, int]:
        """Output dims as a name -> size dict (ordered)."""
        return dict(self.dims)

    @property
    def numel(self) -> int:
        """Number of elements of the output tensor."""
        n = 1
        for _, size in self.dims:
            n *= size
        return n

    def with_dims_without(self, dim: str) -> Node:
        """A copy of this node whose output lacks ``dim`` (used by shape rules)."""
        return Node(self.id, self.kind, self.inputs, tuple(d for d in self.dims if d[0] != dim),
                    self.dtype, self.layer, self.attrs)

    @property
    def is_parameter(self) -> bool:
        return self.kind is OpKind.PARAMETER

    @property
    def is_leaf(self) -> bool:
        return self.kind in (OpKind.INPUT, OpKind.PARAMETER)


def make_node(
    id: str,
    kind: OpKind | str,
    inputs: Iterable[str] = (),
    dims: Mapping[str, int] | Dims = (),
    *,
    dtype: str = "bf16",
    layer: str | None = None,
    **attrs: Any,
) -> Node:
    """Convenience constructor used by frontends: ``dims`` may be a dict, attrs are keywords."""
    d = tuple(dims.items()) if isinstance(dims, Mapping) else tuple(dims)
    return Node(id=id, kind=OpKind(kind), inputs=tuple(inputs), dims=d, dtype=dtype, layer=layer,
                attrs=_freeze(attrs))


@dataclass(frozen=True)
class Graph:
    """An operator graph. Construct through :func:`Graph.of` (builds the id index).

    ``meta`` carries free-form facts about the model (family, config, parameter count).
    Graphs are not validated on construction; call
    :func:`parplan.solver.validate.validate_graph`.
    """

    name: str
    nodes: tuple[Node, ...]
    meta: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    _index: Mapping[str, Node] = field(default_factory=lambda: MappingProxyType({}), repr=False,
                                       compare=False)
    #: values derived from the graph alone, computed once (a graph never changes once made; a new
    #: graph, e.g. from ``dataclasses.replace``, starts empty)
    memo: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    @staticmethod
    def of(name: str, nodes: Iterable[Node], meta: Mapping[str, Any] | None = None) -> Graph:
        ns = tuple(nodes)
        index = {n.id: n for n in ns}
        return Graph(name=name, nodes=ns, meta=_freeze(meta), _index=MappingProxyType(index))

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._index

    def owns(self, node: Node) -> bool:
        """Whether ``node`` is this graph's own node object (what may be remembered in ``memo``)."""
        return self._index.get(node.id) is node

    def node(self, node_id: str) -> Node:
        """The node with this id (KeyError if absent)."""
        return self._index[node_id]

    def parameters(self) -> list[Node]:
        return [n for n in self.nodes if n.kind is OpKind.PARAMETER]

    def parameter_count(self) -> int:
        """Total number of trainable elements."""
        return sum(n.numel for n in self.nodes if n.kind is OpKind.PARAMETER)

    def consumers(self) -> dict[str, list[str]]:
        """Map node id -> ids of nodes that read it (in graph order, duplicates kept once)."""
        out: dict[str, list[str]] = {n.id: [] for n in self.nodes}
        for n in self.nodes:
            for i in dict.fromkeys(n.inputs):
                if i in out:
                    out[i].append(n.id)
        return out

    def layers(self) -> dict[str | None, list[Node]]:
        """Nodes grouped by ``layer`` tag, in graph order (``None`` for untagged nodes)."""
        groups: dict[str | None, list[Node]] = {}
        for n in self.nodes:
            groups.setdefault(n.layer, []).append(n)
        return groups


def parse_equation(equation: str) -> tuple[list[list[str]], list[str]]:
    """Split ``"a b c, c d -> a b d"`` into operand dim-name lists and the output list."""
    if "->" not in equation:
        raise ValueError("equation needs '->'")
    lhs, rhs = equation.split("->", 1)
    operands = [op.split() for op in lhs.split(",")]
    return operands, rhs.split()


def attention_dims(node: Node, q: Node, k: Node) -> tuple[str, str]:
    """``(head_dim, kv_seq)``: the names of the head dim and of the key-sequence dim (a dim of k).

    ``attrs.head_dim`` / ``attrs.kv_seq_dim`` name them explicitly. Otherwise ``head_dim`` is the
    last dim of q that k also has, and ``kv_seq`` is chosen among k's dims other than
    ``head_dim`` and dims whose name contains ``head`` or ``batch``:
    the only one that q lacks (cross-attention, ``kv_seq``); else the only one whose name
    contains ``seq`` (self-attention sharing ``seq``, GQA with ``kv_heads``); else the only one
    left; else k's second dim (the layout ``[batch, kv_seq, kv_heads, head_dim]``).
    """
    qd, kd = dict(q.dims), dict(k.dims)
    head_dim = node.attrs.get("head_dim")
    if head_dim is None:
        shared = [d for d in qd if d in kd]
        if not shared:
            raise ConfigError(f"attention node {node.id!r}: q and k share no dim (need head_dim)")
        head_dim = shared[-1]
    kv_seq = node.attrs.get("kv_seq_dim")
    if kv_seq is not None:
        if kv_seq not in kd:
            raise ConfigError(f"attention node {node.id!r}: attrs.kv_seq_dim {kv_seq!r} is not a dim of k")
        return str(head_dim), str(kv_seq)
    cands = [d for d in kd if d != head_dim and "head" not in d.lower() and "batch" not in d.lower()]
    k_only = [d for d in cands if d not in qd]
    if len(k_only) == 1:
        return str(head_dim), k_only[0]
    seqish = [d for d in (k_only or cands) if "seq" in d.lower()]
    if len(seqish) == 1:
        return str(head_dim), seqish[0]
    if len(cands) == 1:
        return str(head_dim), cands[0]
    if len(k.dims) >= 2 and k.dims[1][0] != head_dim:
        return str(head_dim), k.dims[1][0]
    raise ConfigError(f"attention node {node.id!r}: cannot tell the key-sequence dim of k "
                      f"{list(kd)}; set attrs.kv_seq_dim")




def value_head_dim(node: Node, q: Node, k: Node, v: Node) -> str | None:
    """The name of the value's head dim when it is not the query/key head dim (multi-head latent
    attention: values ``v_head_dim`` wide, queries and keys ``head_dim``), else None. The value must
    then have the key's dims with the key's head dim replaced by that one dim; ConfigError otherwise."""
    kd, vd = dict(k.dims), dict(v.dims)
    if kd == vd:
        return None
    head_dim, _ = attention_dims(node, q, k)
    only_v = [d for d in vd if d not in kd]
    rest_k = {d: s for d, s in kd.items() if d != head_dim}
    if head_dim in vd or len(only_v) != 1 or rest_k != {d: s for d, s in vd.items() if d != only_v[0]}:
        raise ConfigError(f"attention node {node.id!r}: value dims {vd} differ from key dims {kd} by more than "
                          f"their head dim {head_dim!r}")
    return only_v[0]


@dataclass(frozen=True)
class AttentionGeometry:
    """Sizes of an attention node: its head dim and key length, and the score matrix's elements."""

    head_dim: int
    kv_seq: int
    scores_numel: int  # batch x query heads x query length x key length


def attention_geometry(node: Node, q: Node, k: Node) -> AttentionGeometry:
    """Read an ``attention`` node's sizes by its dims' names (see :func:`attention_dims`)."""
    head_name, kv_name = attention_dims(node, q, k)
    d = dict(q.dims).get(head_name, 1)
    kv = dict(k.dims)[kv_name]
    return AttentionGeometry(head_dim=d, kv_seq=kv, scores_numel=q.numel // d * kv)

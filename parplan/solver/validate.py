"""Graph validation: structure (ids, inputs, cycles) and shape rules of each operator kind.

Every problem names the node and the field (``inputs[1]``, ``dims.hidden``, ``attrs.equation``)
so a client can fix its graph without guessing. Linear in the graph size.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from parplan.solver.errors import ConfigError, GraphIssue, GraphValidationError
from parplan.solver.ir import (
    DTYPE_BYTES,
    ELEMENTWISE_FNS,
    Graph,
    Node,
    OpKind,
    attention_dims,
    parse_equation,
    value_head_dim,
)

#: Largest size accepted for one dim, and for a whole tensor (elements); beyond is "absurd".
MAX_DIM_SIZE = 2**36
MAX_TENSOR_NUMEL = 2**50

_DIM_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

#: (min inputs, max inputs) per kind; None = unbounded.
_ARITY: Mapping[OpKind, tuple[int, int | None]] = {
    OpKind.INPUT: (0, 0), OpKind.PARAMETER: (0, 0), OpKind.EINSUM: (1, None),
    OpKind.ELEMENTWISE: (1, None), OpKind.DROPOUT: (1, 1), OpKind.SOFTMAX: (1, 1),
    OpKind.LAYERNORM: (2, 3), OpKind.RMSNORM: (2, 2), OpKind.EMBEDDING: (2, 2),
    OpKind.ATTENTION: (3, 4), OpKind.CROSS_ENTROPY: (2, 2), OpKind.DISPATCH: (2, 2),
    OpKind.COMBINE: (2, 2), OpKind.RESHAPE: (1, 1), OpKind.REDUCE: (1, 1), OpKind.CONCAT: (1, None),
}


class _Issues:
    def __init__(self) -> None:
        self.items: list[GraphIssue] = []

    def add(self, node: str | None, field: str, message: str) -> None:
        self.items.append(GraphIssue(node, field, message))


#: ``Graph.memo`` key set once a graph passed :func:`validate_graph` (a graph never changes).
_VALID = "validated"


def validate_graph(graph: Graph, *, resized_from: Graph | None = None) -> None:
    """Raise :class:`GraphValidationError` listing every problem; return None when valid.

    A graph that passed before returns at once. ``resized_from``: a valid graph that ``graph``
    copies but for the sizes of some dims (same ids, inputs, kinds, dtypes, dim names and attrs),
    so only what sizes decide is checked again (each size, each tensor's elements, shape rules)."""
    if graph.memo.get(_VALID):
        return
    issues = _Issues()
    structure_known = resized_from is not None and bool(resized_from.memo.get(_VALID))
    dangling: set[str] = set()
    order_ok = True
    if structure_known:
        for n in graph.nodes:
            _check_sizes(n, issues)
    else:
        seen: set[str] = set()
        for n in graph.nodes:
            if n.id in seen:
                issues.add(n.id, "id", "duplicated id")
            seen.add(n.id)
        for n in graph.nodes:
            _check_node_local(n, issues)
        dangling = _check_inputs(graph, issues)
        order_ok = _check_acyclic(graph, issues)
    if order_ok:
        for n in graph.nodes:
            if n.id in dangling or n.is_leaf:
                continue
            ins = [graph.node(i) for i in n.inputs]
            _check_shapes(n, ins, issues)
    if issues.items:
        raise GraphValidationError(issues.items)
    graph.memo[_VALID] = True


def _check_node_local(n: Node, issues: _Issues) -> None:
    if not isinstance(n.kind, OpKind):  # pragma: no cover - constructors enforce it
        issues.add(n.id, "kind", f"unknown op kind {n.kind!r}")
        return
    if n.dtype not in DTYPE_BYTES:
        issues.add(n.id, "dtype", f"unknown dtype {n.dtype!r}; known: {', '.join(DTYPE_BYTES)}")
    lo, hi = _ARITY[n.kind]
    k = len(n.inputs)
    if k < lo or (hi is not None and k > hi):
        want = f"{lo}" if lo == hi else f"{lo} to {hi if hi is not None else 'any'}"
        issues.add(n.id, "inputs", f"{n.kind.value} takes {want} inputs, got {k}")
    names: set[str] = set()
    for name, _ in n.dims:
        if not _DIM_NAME.match(name):
            issues.add(n.id, "dims", f"bad dim name {name!r}")
        if name in names:
            issues.add(n.id, f"dims.{name}", "dim name used twice in one tensor")
        names.add(name)
    _check_sizes(n, issues)


def _check_sizes(n: Node, issues: _Issues) -> None:
    """Each dim's size, and the tensor's elements, within bounds."""
    numel = 1
    for name, size in n.dims:
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            issues.add(n.id, f"dims.{name}", f"size must be a positive integer, got {size!r}")
            continue
        if size > MAX_DIM_SIZE:
            issues.add(n.id, f"dims.{name}", f"absurd size {size} (limit {MAX_DIM_SIZE})")
        numel *= size
    if numel > MAX_TENSOR_NUMEL:
        issues.add(n.id, "dims", f"absurd tensor of {numel} elements (limit {MAX_TENSOR_NUMEL})")


def _check_inputs(graph: Graph, issues: _Issues) -> set[str]:
    """Report inputs naming no node; return ids of nodes with such inputs."""
    dangling: set[str] = set()
    for n in graph.nodes:
        for pos, i in enumerate(n.inputs):
            if i not in graph:
                issues.add(n.id, f"inputs[{pos}]", f"refers to unknown node {i!r}")
                dangling.add(n.id)
            elif i == n.id:
                issues.add(n.id, f"inputs[{pos}]", "node reads its own output (cycle)")
                dangling.add(n.id)
    return dangling


def _check_acyclic(graph: Graph, issues: _Issues) -> bool:
    """Kahn's algorithm; on a cycle, report one node on it and the cycle's path."""
    indeg: dict[str, int] = {n.id: 0 for n in graph.nodes}
    succ: dict[str, list[str]] = {n.id: [] for n in graph.nodes}
    for n in graph.nodes:
        for i in dict.fromkeys(n.inputs):
            if i in indeg and i != n.id:
                indeg[n.id] += 1
                succ[i].append(n.id)
    ready = [k for k, d in indeg.items() if d == 0]
    done = 0
    while ready:
        k = ready.pop()
        done += 1
        for s in succ[k]:
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    if done == len(indeg):
        return True
    remaining = {k for k, d in indeg.items() if d > 0}
    path = _find_cycle(graph, remaining)
    issues.add(path[0], "inputs", "cycle: " + " -> ".join(path))
    return False


def _find_cycle(graph: Graph, remaining: set[str]) -> list[str]:
    """Walk backwards along inputs inside ``remaining`` until a node repeats."""
    start = next(n.id for n in graph.nodes if n.id in remaining)
    seen: dict[str, int] = {}
    walk: list[str] = []
    cur = start
    while cur not in seen:
        seen[cur] = len(walk)
        walk.append(cur)
        cur = next(i for i in graph.node(cur).inputs if i in remaining)
    cycle = walk[seen[cur]:]
    cycle.reverse()
    return [*cycle, cycle[0]]


def _merge_sizes(n: Node, ins: list[Node], positions: list[int], issues: _Issues) -> dict[str, int] | None:
    """Union of the named dims of some inputs; report the first size disagreement."""
    sizes: dict[str, int] = {}
    where: dict[str, int] = {}
    ok = True
    for pos in positions:
        for name, size in ins[pos].dims:
            if name in sizes and sizes[name] != size:
                issues.add(n.id, f"inputs[{pos}]",
                           f"dim {name!r} is {size} in {ins[pos].id!r} but {sizes[name]} in "
                           f"{ins[where[name]].id!r} (inputs[{where[name]}])")
                ok = False
            elif name not in sizes:
                sizes[name] = size
                where[name] = pos
    return sizes if ok else None


def _expect(n: Node, expected: dict[str, int], issues: _Issues) -> None:
    declared = dict(n.dims)
    if declared == expected:
        return
    for name, size in expected.items():
        if name not in declared:
            issues.add(n.id, "dims", f"missing dim {name!r} (size {size}) that the inputs imply")
        elif declared[name] != size:
            issues.add(n.id, f"dims.{name}", f"declared {declared[name]} but the inputs give {size}")
    for name in declared:
        if name not in expected:
            issues.add(n.id, f"dims.{name}", f"dim {name!r} does not follow from the inputs")


def _attr_dim(n: Node, key: str, ins: Node, issues: _Issues, default: str | None = None) -> str | None:
    dim = n.attrs.get(key, default)
    if not isinstance(dim, str):
        issues.add(n.id, f"attrs.{key}", "required (a dim name)")
        return None
    if dim not in dict(ins.dims):
        issues.add(n.id, f"attrs.{key}", f"dim {dim!r} is not a dim of input {ins.id!r}")
        return None
    return dim


def _einsum_shape(n: Node, ins: list[Node], issues: _Issues) -> None:
    eq = n.attrs.get("equation")
    if not isinstance(eq, str):
        issues.add(n.id, "attrs.equation", "required, e.g. 'batch seq hidden, hidden ffn -> batch seq ffn'")
        return
    try:
        operands, out = parse_equation(eq)
    except ValueError as e:
        issues.add(n.id, "attrs.equation", str(e))
        return
    if len(operands) != len(ins):
        issues.add(n.id, "attrs.equation", f"{len(operands)} operands for {len(ins)} inputs")
        return
    for pos, (names, node) in enumerate(zip(operands, ins, strict=True)):
        if sorted(names) != sorted(dict(node.dims)):
            issues.add(n.id, f"inputs[{pos}]", f"equation operand {' '.join(names)!r} does not match "
                       f"the dims of {node.id!r}: {' '.join(dict(node.dims))!r}")
            return
    sizes = _merge_sizes(n, ins, list(range(len(ins))), issues)
    if sizes is None:
        return
    if len(set(out)) != len(out) or any(o not in sizes for o in out):
        issues.add(n.id, "attrs.equation", "output names must be distinct dims of the operands")
        return
    _expect(n, {o: sizes[o] for o in out}, issues)


def _elementwise_shape(n: Node, ins: list[Node], issues: _Issues) -> None:
    fn = n.attrs.get("fn")
    if fn not in ELEMENTWISE_FNS:
        issues.add(n.id, "attrs.fn", f"unknown elementwise fn {fn!r}; known: {', '.join(sorted(ELEMENTWISE_FNS))}")
    sizes = _merge_sizes(n, ins, list(range(len(ins))), issues)
    if sizes is not None:
        _expect(n, sizes, issues)


def _same_shape(n: Node, ins: list[Node], issues: _Issues) -> None:
    """Dropout and softmax keep their input's dims (softmax names the dim it normalises)."""
    if n.kind is OpKind.SOFTMAX:
        _attr_dim(n, "dim", ins[0], issues)
    _expect(n, dict(ins[0].dims), issues)


def _norm_shape(n: Node, ins: list[Node], issues: _Issues) -> None:
    """A norm keeps its input's dims; its parameters span the normalised dim alone."""
    dim = _attr_dim(n, "dim", ins[0], issues)
    if dim is not None:
        want = {dim: dict(ins[0].dims)[dim]}
        for pos in range(1, len(ins)):
            if dict(ins[pos].dims) != want:
                issues.add(n.id, f"inputs[{pos}]", f"norm parameter {ins[pos].id!r} must have dims {want}")
    _expect(n, dict(ins[0].dims), issues)


def _embedding_shape(n: Node, ins: list[Node], issues: _Issues) -> None:
    index_dim = _attr_dim(n, "index_dim", ins[1], issues, default="vocab")
    if index_dim is not None:
        table = {d: s for d, s in ins[1].dims if d != index_dim}
        _expect(n, {**dict(ins[0].dims), **table}, issues)


def _attention_shape(n: Node, ins: list[Node], issues: _Issues) -> None:
    q, kk, v = ins[:3]
    try:
        v_head = value_head_dim(n, q, kk, v)
    except ConfigError as e:
        issues.add(n.id, "inputs[2]", str(e))
        return
    if _merge_sizes(n, [q, kk], [0, 1], issues) is not None:
        if v_head is None:
            _expect(n, dict(q.dims), issues)
        else:  # values of another width (MLA): the output has the value's head dim in place of q's
            head_dim, _ = attention_dims(n, q, kk)
            _expect(n, {**{d: s for d, s in q.dims if d != head_dim}, v_head: dict(v.dims)[v_head]}, issues)


def _cross_entropy_shape(n: Node, ins: list[Node], issues: _Issues) -> None:
    cdim = _attr_dim(n, "class_dim", ins[0], issues, default="vocab")
    if cdim is not None:
        want = {d: s for d, s in ins[0].dims if d != cdim}
        if dict(ins[1].dims) != want:
            issues.add(n.id, "inputs[1]", f"labels {ins[1].id!r} must have dims {want}, got {dict(ins[1].dims)}")
        _expect(n, want, issues)


def _dispatch_shape(n: Node, ins: list[Node], issues: _Issues) -> None:
    edim = _attr_dim(n, "expert_dim", ins[1], issues, default="expert")
    cap_dim = n.attrs.get("capacity_dim", "capacity")
    if edim is not None:
        tokens = {d: s for d, s in ins[1].dims if d != edim}
        x = dict(ins[0].dims)
        if any(x.get(d) != s for d, s in tokens.items()):
            issues.add(n.id, "inputs[0]", f"tokens {ins[0].id!r} must carry the gate token dims {tokens}")
            return
        cap = dict(n.dims).get(cap_dim)
        if cap is None:
            issues.add(n.id, "dims", f"dispatch output needs a {cap_dim!r} dim")
            return
        rest = {d: s for d, s in x.items() if d not in tokens}
        _expect(n, {edim: dict(ins[1].dims)[edim], cap_dim: cap, **rest}, issues)


def _combine_shape(n: Node, ins: list[Node], issues: _Issues) -> None:
    edim = _attr_dim(n, "expert_dim", ins[1], issues, default="expert")
    cap_dim = n.attrs.get("capacity_dim", "capacity")
    if edim is not None:
        y = dict(ins[0].dims)
        if y.get(edim) != dict(ins[1].dims)[edim] or cap_dim not in y:
            issues.add(n.id, "inputs[0]", f"expert outputs must have dims {edim!r} (as the gates) and {cap_dim!r}")
            return
        tokens = {d: s for d, s in ins[1].dims if d != edim}
        rest = {d: s for d, s in y.items() if d not in (edim, cap_dim)}
        _expect(n, {**tokens, **rest}, issues)


def _concat_shape(n: Node, ins: list[Node], issues: _Issues) -> None:
    cdim = n.attrs.get("dim")
    if not isinstance(cdim, str) or any(cdim not in dict(i.dims) for i in ins):
        issues.add(n.id, "attrs.dim", "required: a dim every input has")
        return
    total = sum(dict(i.dims)[cdim] for i in ins)
    others = [i.with_dims_without(cdim) for i in ins]
    sizes = _merge_sizes(n, others, list(range(len(ins))), issues)
    if sizes is not None:
        _expect(n, {**sizes, cdim: total}, issues)


def _reshape_shape(n: Node, ins: list[Node], issues: _Issues) -> None:
    if ins[0].numel != n.numel:
        issues.add(n.id, "dims", f"reshape changes the element count: {ins[0].numel} -> {n.numel}")


def _reduce_shape(n: Node, ins: list[Node], issues: _Issues) -> None:
    red = n.attrs.get("over")
    x = dict(ins[0].dims)
    if not isinstance(red, list | tuple) or any(d not in x for d in red):
        issues.add(n.id, "attrs.over", f"must list dims of {ins[0].id!r} to reduce over")
        return
    _expect(n, {d: s for d, s in x.items() if d not in red}, issues)


#: The shape rule of each kind that has inputs.
_SHAPE_RULES: Mapping[OpKind, Callable[[Node, list[Node], _Issues], None]] = {
    OpKind.EINSUM: _einsum_shape,
    OpKind.ELEMENTWISE: _elementwise_shape,
    OpKind.DROPOUT: _same_shape,
    OpKind.SOFTMAX: _same_shape,
    OpKind.LAYERNORM: _norm_shape,
    OpKind.RMSNORM: _norm_shape,
    OpKind.EMBEDDING: _embedding_shape,
    OpKind.ATTENTION: _attention_shape,
    OpKind.CROSS_ENTROPY: _cross_entropy_shape,
    OpKind.DISPATCH: _dispatch_shape,
    OpKind.COMBINE: _combine_shape,
    OpKind.CONCAT: _concat_shape,
    OpKind.RESHAPE: _reshape_shape,
    OpKind.REDUCE: _reduce_shape,
}


def _check_shapes(n: Node, ins: list[Node], issues: _Issues) -> None:
    """The shape rule of ``n``'s kind against its inputs (nothing when its arity is already wrong)."""
    lo, hi = _ARITY[n.kind]
    if len(ins) < lo or (hi is not None and len(ins) > hi):
        return  # arity already reported
    rule = _SHAPE_RULES.get(n.kind)
    if rule is not None:
        rule(n, ins, issues)

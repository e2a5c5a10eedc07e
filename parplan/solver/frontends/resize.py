"""Resize an operator graph along named dims (a traced model at another micro-batch or sequence
length) without rebuilding it.

A traced graph holds some axes twice under two names: the keys' copy of the sequence axis
(``kv_seq``, where ``q @ k^T`` reads one axis on both sides), a mask's second sequence axis, a
second copy of an axis that an elementwise op reads twice. The tracer joins such a copy to its
original by a *rename*: a reshape whose output differs from its input in exactly one dim, of the
same size. A rename keeps the element count only while both names have one size, so resizing one
resizes the other (:func:`linked_dims`). A mixture of experts' ``capacity`` (the tokens each expert
receives, ``ceil(tokens · top_k / experts · capacity_factor)``) follows the tokens it routes
(:func:`capacities`); nothing else ties two names together.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from parplan.solver.errors import ConfigError, GraphValidationError
from parplan.solver.ir import Graph, Node, OpKind
from parplan.solver.validate import validate_graph


def linked_dims(graph: Graph) -> dict[str, str]:
    """Each dim name of a non-parameter tensor -> the representative of its class, the names a
    rename (a one-input reshape that swaps exactly one dim for another of the same size) joins."""
    parent: dict[str, str] = {}

    def find(d: str) -> str:
        while parent.setdefault(d, d) != d:
            parent[d] = parent[parent[d]]
            d = parent[d]
        return d

    for n in graph.nodes:
        if n.kind is not OpKind.RESHAPE or len(n.inputs) != 1 or n.inputs[0] not in graph:
            continue
        src = graph.node(n.inputs[0])
        if src.is_parameter:  # a parameter keeps its sizes: its dims follow nothing
            continue
        before, after = dict(src.dims), dict(n.dims)
        gone = [d for d in before if d not in after]
        new = [d for d in after if d not in before]
        if len(gone) == 1 and len(new) == 1 and before[gone[0]] == after[new[0]]:
            a, b = find(gone[0]), find(new[0])
            if a != b:
                parent[max(a, b)] = min(a, b)
    return {d: find(d) for n in graph.nodes if not n.is_parameter for d, _ in n.dims}


def _capacity(tokens: int, node: Node, experts: int) -> int | None:
    top_k, factor = node.attrs.get("top_k"), node.attrs.get("capacity_factor", 1.0)
    if not isinstance(top_k, int) or not isinstance(factor, int | float) or experts < 1:
        return None
    return math.ceil(tokens * top_k / experts * factor)


def capacities(graph: Graph, todo: Mapping[str, int]) -> dict[str, int]:
    """The capacity dim of each dispatch whose routed tokens ``todo`` resizes -> its new size, by
    the rule the builder and the tracer write it with (the average load, times the capacity
    factor). A capacity that does not follow the rule at the graph's own size (a graph written
    with another) keeps its size."""
    out: dict[str, int] = {}
    for n in graph.nodes:
        if n.kind is not OpKind.DISPATCH or len(n.inputs) != 2 or n.inputs[1] not in graph:
            continue
        gate, edim = graph.node(n.inputs[1]), str(n.attrs.get("expert_dim", "expert"))
        cap_dim = str(n.attrs.get("capacity_dim", "capacity"))
        tokens = [(d, s) for d, s in gate.dims if d != edim]
        experts, cap = dict(gate.dims).get(edim, 0), dict(n.dims).get(cap_dim)
        if not any(d in todo for d, _ in tokens) or cap != _capacity(math.prod(s for _, s in tokens), n, experts):
            continue
        new = _capacity(math.prod(todo.get(d, s) for d, s in tokens), n, experts)
        if new is not None:
            out[cap_dim] = new
    return out


def resize_graph(graph: Graph, sizes: Mapping[str, int]) -> Graph:
    """The same graph with named dims (and the dims :func:`linked_dims` joins to them) set to new
    sizes on every non-parameter tensor (parameters keep theirs); ConfigError when two requested
    sizes fall on one class of linked dims or the graph's shape rules no longer hold afterwards."""
    links = linked_dims(graph)
    asked = {d: s for d, s in sizes.items() if d in links}
    if not asked:
        return graph
    by_class: dict[str, tuple[str, int]] = {}
    for d, s in asked.items():
        other = by_class.setdefault(links[d], (d, s))
        if other[1] != s:
            raise ConfigError(f"graph {graph.name!r}: {other[0]} and {d} are one axis (a reshape renames one "
                              f"to the other) and cannot be resized to {other[1]} and {s}")
    todo = {d: by_class[c][1] for d, c in links.items() if c in by_class}
    for cap_dim, cap in capacities(graph, todo).items():
        todo.update({d: cap for d, c in links.items() if c == links.get(cap_dim)})
    nodes = [n if n.is_parameter else Node(n.id, n.kind, n.inputs,
                                           tuple((d, todo.get(d, s)) for d, s in n.dims), n.dtype, n.layer, n.attrs)
             for n in graph.nodes]
    meta = dict(graph.meta) | ({"seq_len": asked["seq"]} if "seq" in asked else {})
    if "batch" in asked and "batch" in meta:  # the tracer's record of the samples the graph is for
        meta["batch"] = asked["batch"]
    out = Graph.of(graph.name, nodes, meta)
    try:
        validate_graph(out, resized_from=graph)
    except GraphValidationError as e:
        raise ConfigError(f"graph {graph.name!r} cannot be resized to {asked}: {e}; submit it built for "
                          f"the micro-batch and sequence length you want") from None
    return out

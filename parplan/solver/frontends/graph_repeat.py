"""Grow the traced graph of a model cut to a few layers (:mod:`.layer_pattern`) to the full depth.

Node ids of a traced graph are module paths and fx node names (``model.layers.5.mlp.linear_37``):
from one period of layers to the next, the layer index advances by the period and every fx name's
counter by the number of nodes of that name a period holds. :class:`IdShift` learns these steps
from the first two traced periods, and the graph is grown only when they predict the third period
node for node (ids, inputs, dims, attributes and layer tags); the third period is then repeated
for the periods the full model has beyond the traced ones, and the layers and head after it are
shifted past them. Otherwise :func:`expand_graph` returns None and the caller traces every layer.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from parplan.solver.frontends.layer_pattern import LayerPattern
from parplan.solver.frontends.torch_trace.emit import units_in_order
from parplan.solver.ir import Graph, Node

_SUFFIXED = re.compile(r"^(.*?)_(\d+)$")
#: A dim the tracer could not name from its role: ``d<k>``, numbered in order of first use
#: (``d<k>#<copy>`` while a graph is grown).
_UNNAMED = re.compile(r"^d\d+(#\d+)?$")
#: A dim name inside an attribute's text (an einsum equation).
_DIM_IN_TEXT = re.compile(r"(?<![\w#])[A-Za-z_][\w]*(#\d+)?(?![\w#])")


@dataclass(frozen=True)
class _Segment:
    """One dot-separated piece of an id: numbered (``linear_7``: key ``linear``, 7; ``5`` after
    ``layers``: key ``layers.#``, 5) or plain text (``q_proj``, ``mul`` as a suffix the tracer adds,
    an fx name's first use ``linear``: counter 0)."""

    text: str
    key: str
    counter: int
    digits: bool  # the whole piece is the number
    numbered: bool


def _segments(node_id: str) -> list[_Segment]:
    out: list[_Segment] = []
    for seg in node_id.split("."):
        if seg.isdigit():
            out.append(_Segment(seg, (out[-1].key if out else "") + ".#", int(seg), True, True))
            continue
        m = _SUFFIXED.match(seg)
        out.append(_Segment(seg, m.group(1), int(m.group(2)), False, True) if m
                   else _Segment(seg, seg, 0, False, False))
    return out


class IdShift:
    """How ids advance by one period: the step of each counter key."""

    def __init__(self, steps: dict[str, int]) -> None:
        self.steps = steps

    @classmethod
    def learn(cls, pairs: Iterable[tuple[str, str]]) -> IdShift | None:
        """The steps that map each first id of ``pairs`` to the second; None when the ids differ in
        anything but counters or a key would need two steps."""
        steps: dict[str, int] = {}
        for a, b in pairs:
            sa, sb = _segments(a), _segments(b)
            if len(sa) != len(sb):
                return None
            for x, y in zip(sa, sb, strict=True):
                if not x.numbered and not y.numbered:
                    if x.text != y.text:
                        return None
                    continue
                if x.key != y.key or x.digits != y.digits:
                    return None
                if steps.setdefault(x.key, y.counter - x.counter) != y.counter - x.counter:
                    return None
        return cls(steps)

    def __call__(self, node_id: str, periods: int) -> str:
        """``node_id`` moved on by ``periods`` periods."""
        if periods == 0:
            return node_id
        parts = []
        for seg in _segments(node_id):
            step = self.steps.get(seg.key, 0) if seg.numbered else 0
            if step == 0:
                parts.append(seg.text)
                continue
            n = seg.counter + periods * step
            if seg.digits:
                parts.append(str(n))
            else:
                parts.append(f"{seg.key}_{n}" if n > 0 else seg.key)
        return ".".join(parts)


def expand_graph(graph: Graph, pattern: LayerPattern) -> Graph | None:
    """The graph of the full-depth model, from ``graph`` traced on the first ``pattern.traced``
    layers; None when the traced periods do not repeat node for node."""
    index = _Index(pattern.path)
    p, first = pattern.period, pattern.learn_from
    period_a, period_b, period_c = ([n for n in graph.nodes if _within(index(n.layer), first + j * p, p)]
                                    for j in range(3))
    if not period_a or len(period_a) != len(period_b) or len(period_b) != len(period_c):
        return None
    shift = IdShift.learn(zip((n.id for n in period_a), (n.id for n in period_b), strict=True))
    if shift is None:
        return None
    predicted = [_Mover(graph, index, shift, set(), moving_from=first).moved(n, 1) for n in period_b]
    rename = _dim_bijection(predicted, period_c, _local_dims(graph, period_b))
    if rename is None or [_renamed(n, rename) for n in predicted] != period_c:
        return None
    mover = _Mover(graph, index, shift, _local_dims(graph, period_c), moving_from=first + p)
    extra = pattern.extra_periods
    repeated = pattern.repeated
    nodes: list[Node] = []
    run: list[Node] = []

    def flush() -> None:
        nodes.extend(run)
        for s in range(1, extra + 1):
            nodes.extend(mover.moved(n, s) for n in run)
        run.clear()

    for n in graph.nodes:
        i = index(n.layer)
        if i is not None and i in repeated:
            run.append(n)
            continue
        if run:
            flush()
        after = (i is not None and i >= repeated.stop) or (i is None and n.layer == "head")
        nodes.append(mover.moved(n, extra) if after else n)
    if run:
        flush()
    nodes = _number_unnamed_dims(nodes)
    meta = dict(graph.meta) | {"parameter_count": sum(n.numel for n in nodes if n.is_parameter)}
    if "units" in meta:
        meta["units"] = units_in_order(nodes)
    return Graph.of(graph.name, nodes, meta)


def _local_dims(graph: Graph, period: Sequence[Node]) -> set[str]:
    """Unnamed dims (``d<k>``) that only nodes of ``period`` have: each copy of it gets its own."""
    inside = {d for n in period for d, _ in n.dims if _UNNAMED.match(d)}
    ids = {n.id for n in period}
    return inside - {d for n in graph.nodes if n.id not in ids for d, _ in n.dims}


def _dim_bijection(predicted: Sequence[Node], actual: Sequence[Node], local: set[str]) -> dict[str, str] | None:
    """The one-to-one renaming of ``local`` dims that turns the dims of ``predicted`` into those of
    ``actual`` (other dims equal); None when there is none."""
    rename: dict[str, str] = {}
    for a, b in zip(predicted, actual, strict=True):
        if len(a.dims) != len(b.dims):
            return None
        for (x, sx), (y, sy) in zip(a.dims, b.dims, strict=True):
            if sx != sy or (x not in local and x != y) or rename.setdefault(x, y) != y:
                return None
    if len(set(rename.values())) != len(rename):
        return None
    return rename


def _renamed(n: Node, rename: Mapping[str, str]) -> Node:
    """``n`` with dims renamed, in its dims and in the attributes that name dims."""
    def text(m: re.Match[str]) -> str:
        return rename.get(m.group(0), m.group(0))

    def attr(value: Any) -> Any:
        if isinstance(value, str):
            return _DIM_IN_TEXT.sub(text, value)
        if isinstance(value, list | tuple):
            return type(value)(attr(v) for v in value)
        return value

    dims = tuple((rename.get(d, d), size) for d, size in n.dims)
    attrs = MappingProxyType({k: attr(v) for k, v in n.attrs.items()})
    return Node(n.id, n.kind, n.inputs, dims, n.dtype, n.layer, attrs)


def _number_unnamed_dims(nodes: list[Node]) -> list[Node]:
    """Unnamed dims numbered ``d0, d1, ...`` in order of first use, as the tracer numbers them."""
    taken = {d for n in nodes for d, _ in n.dims if not _UNNAMED.match(d)}
    rename: dict[str, str] = {}
    k = 0
    for n in nodes:
        for d, _ in n.dims:
            if _UNNAMED.match(d) and d not in rename:
                while f"d{k}" in taken:
                    k += 1
                rename[d] = f"d{k}"
                k += 1
    return [_renamed(n, rename) for n in nodes]


class _Mover:
    """Copies of nodes ``periods`` periods on: ids, layer tags, and inputs from layers at or after
    ``moving_from`` (or the head) move; inputs from earlier layers and the embedding stay."""

    def __init__(self, graph: Graph, index: _Index, shift: IdShift, local: set[str], moving_from: int) -> None:
        self.graph = graph
        self.index = index
        self.shift = shift
        self.local = local
        self.moving_from = moving_from

    def moved(self, n: Node, periods: int) -> Node:
        if periods == 0:
            return n
        inputs = tuple(self.shift(i, periods) if self._moves(i) else i for i in n.inputs)
        layer = self.shift(n.layer, periods) if n.layer is not None else None
        moved = Node(self.shift(n.id, periods), n.kind, inputs, n.dims, n.dtype, layer, n.attrs)
        return _renamed(moved, {d: f"{d}#{periods}" for d in self.local}) if self.local else moved

    def _moves(self, node_id: str) -> bool:
        src = self.graph.node(node_id)
        i = self.index(src.layer)
        return (i is not None and i >= self.moving_from) or (i is None and src.layer == "head")


class _Index:
    """The decoder-layer index a layer tag names (``model.layers.5`` and ``model.layers.5.post``: 5)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix + "."

    def __call__(self, layer: str | None) -> int | None:
        if layer is None or not layer.startswith(self.prefix):
            return None
        head = layer[len(self.prefix):].partition(".")[0]
        return int(head) if head.isdigit() else None


def _within(i: int | None, start: int, length: int) -> bool:
    return i is not None and start <= i < start + length

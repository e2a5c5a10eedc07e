"""The per-operator terms of the ILP's moments (:mod:`.moments`) as linear expressions of the
choice: every quantity the step's walk adds up is a sum of terms that each depend on one operator's
strategy (a saved tensor's size on its owner's, a gradient's on the operator that makes it, a
gathered weight on its owner's ZeRO stage) or on one edge's pair of strategies (a tensor saved as
its reader received it), priced by the per-operator rules of :mod:`parplan.solver.cost.backward`.
Bytes per device.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import numpy as np

from parplan.solver.cost.activations import SavedItem, block_of, is_float, tensor_bytes
from parplan.solver.cost.backward import op_input_gradient_bytes, op_transient_bytes, selective_rebuilt_items
from parplan.solver.cost.layout import TensorLayout
from parplan.solver.cost.op_layout import OpStrategy, input_layout, output_layout
from parplan.solver.cost.resharding import conversion_buffer_bytes, gradient_conversion_buffer_bytes
from parplan.solver.cost.rules import optimizer_temporary_bytes
from parplan.solver.cost.timeline import forward_live
from parplan.solver.ilp.costs import owner_saved_bytes, signature
from parplan.solver.ilp.graph_problem import GraphProblem, consumer_saves, partial_saved_bytes, resharded_copy_bytes
from parplan.solver.ilp.model import PeakTerm
from parplan.solver.ir import Node, OpKind
from parplan.solver.strategy import SEQ_DIMS

_K = TypeVar("_K")


@dataclass
class Lin:
    """A linear expression of the choice: per variable set a value per candidate, per edge a value
    per pair of classes (numpy arrays, never changed in place once made, so expressions share them)."""

    nodes: dict[str, np.ndarray] = field(default_factory=dict)
    edges: dict[int, np.ndarray] = field(default_factory=dict)
    #: per gate of the problem (:class:`~parplan.solver.ilp.model.Gate`), its coefficient
    gates: dict[int, float] = field(default_factory=dict)

    def add(self, other: Lin, k: float = 1.0) -> Lin:
        """A new expression: ``self + k·other`` (``self`` itself when ``other`` is empty)."""
        if not other.nodes and not other.edges and not other.gates:
            return self
        return Lin(_plus(self.nodes, other.nodes, k), _plus(self.edges, other.edges, k),
                   _plus(self.gates, other.gates, k))

    def term(self) -> PeakTerm:
        return PeakTerm(nodes={r: v for r, v in self.nodes.items() if v.any()},
                        edges={e: m for e, m in self.edges.items() if m.any()},
                        gates={g: k for g, k in self.gates.items() if k})


_V = TypeVar("_V", np.ndarray, float)


def _plus(a: dict[_K, _V], b: dict[_K, _V], k: float) -> dict[_K, _V]:
    """``a + k·b`` key by key, as a new dict (no array is changed)."""
    out = dict(a)
    for key, v in b.items():
        cur = out.get(key)
        scaled = v if k == 1.0 else k * v
        out[key] = scaled if cur is None else cur + scaled
    return out


def lin_sum(parts: Iterable[Lin]) -> Lin:
    total = Lin()
    for p in parts:
        total = total.add(p)
    return total


def _out(gp: GraphProblem, node: Node, s: OpStrategy) -> TensorLayout:
    """``output_layout`` of ``node`` under ``s``, remembered for the problem (the moments ask for the
    same layouts many times)."""
    cache = gp.caches.setdefault("out", {})
    key = (node.id, s)
    lay = cache.get(key)
    if lay is None:
        lay = cache[key] = output_layout(node, s, gp.ctx.mesh, gp.partial_dims[node.id])
    return lay  # type: ignore[no-any-return]


def _in(gp: GraphProblem, node: Node, position: int, s: OpStrategy) -> TensorLayout:
    """``input_layout`` of ``node``'s input ``position`` under ``s``, remembered for the problem."""
    cache = gp.caches.setdefault("in", {})
    key = (node.id, position, s)
    lay = cache.get(key)
    if lay is None:
        lay = cache[key] = input_layout(node, position, gp.ctx.graph, s, gp.ctx.mesh)
    return lay  # type: ignore[no-any-return]


def _shards(gp: GraphProblem, lay: TensorLayout) -> int:
    """Pieces ``lay`` cuts a tensor into on the problem's mesh, remembered."""
    cache = gp.caches.setdefault("shards", {})
    n = cache.get(lay)
    if n is None:
        n = cache[lay] = lay.shards(gp.ctx.mesh.sizes)
    return n  # type: ignore[no-any-return]


class _IlpSizes:
    """Per-operator sizes (:class:`~parplan.solver.cost.op_sizes.OpSizes`) of operator ``n`` under
    candidate ``s`` of its variable set; a view that follows its producer takes the producer's."""

    def __init__(self, gp: GraphProblem, s: OpStrategy, origin: Node) -> None:
        self.gp, self.s, self.origin = gp, s, origin
        self.sizes = gp.ctx.mesh.sizes

    def _out_shards(self) -> float:
        o = self.origin
        return _shards(self.gp, _out(self.gp, o, self.s))

    def output(self, n: Node) -> float:
        return n.numel / self._out_shards()

    def input(self, n: Node, position: int) -> float:
        src = self.gp.ctx.graph.node(n.inputs[position])
        if n.id != self.origin.id:  # a view reads its producer's output as it is
            return src.numel / self._out_shards()
        return src.numel / _shards(self.gp, _in(self.gp, n, position, self.s))

    def weight_grad(self, n: Node, position: int) -> float:
        graph = self.gp.ctx.graph
        w = graph.node(n.inputs[position])
        local = w.numel / _shards(self.gp, _in(self.gp, n, position, self.s))
        if n.kind is OpKind.EMBEDDING and self.gp.ctx.runtime.full_embedding_gradient:
            return w.numel + (local if local < w.numel else 0.0)
        return local

    def class_shards(self, n: Node) -> int:
        if n.kind is not OpKind.CROSS_ENTROPY or n.id != self.origin.id:
            return 1
        return _in(self.gp, n, 0, self.s).shards(self.sizes, [str(n.attrs.get("class_dim", "vocab"))])

    def recomputed_bytes(self, n: Node) -> float:
        ctx = self.gp.ctx
        items = selective_rebuilt_items(n, ctx.graph, ctx.precision.activation_bytes, ctx.recompute,
                                        ctx.flash_attention, ctx.runtime)
        if not items or n.id != self.origin.id:
            return 0.0
        lay = _out(self.gp, n, self.s)
        return sum(it.total_bytes / lay.shards(self.sizes, it.dims) for it in items)

    def sp_gather(self, n: Node) -> float:
        if n.kind not in (OpKind.LAYERNORM, OpKind.RMSNORM) or block_of(n) is None:
            return 0.0
        lay = _out(self.gp, n, self.s)
        if not any(d in SEQ_DIMS for d, _ in lay.split):
            return 0.0
        return n.numel / TensorLayout(tuple((d, a) for d, a in lay.split if d not in SEQ_DIMS)).shards(self.sizes)


class Terms:
    """The per-operator terms of one problem, as linear expressions."""

    def __init__(self, gp: GraphProblem) -> None:
        self.gp = gp
        ctx = gp.ctx
        self.graph = ctx.graph
        self.act = ctx.precision.activation_bytes
        self.prec = ctx.precision
        self.sizes = ctx.mesh.sizes
        self.owner_of: dict[str, tuple[str, SavedItem]] = {}  # key -> (owner op, item)
        for op, items in ctx.saved_by_owner.items():
            for it in items:
                self.owner_of[it.key] = (op, it)
        self.first_edge: dict[str, tuple[str, str, int]] = {}
        self.edges_into: dict[str, list[tuple[str, str, int]]] = {}  # consumer -> its edges, in order
        for edge in gp.edges:
            self.first_edge.setdefault(self._origin(edge[0]), edge)
            self.edges_into.setdefault(edge[1], []).append(edge)
        layer = {n.id: n.layer for n in self.graph.nodes}
        self.tied_ids = frozenset(self.graph.node(owner).inputs[opos] for owner, opos, user, _ in gp.param_edges
                                  if layer[owner] != layer[user])

    def _origin(self, op: str) -> str:
        while op in self.gp.follows:
            op = self.gp.follows[op]
        return op

    def _rep(self, op: str) -> str:
        return self.gp.rep_of[self._origin(op)]

    def signature(self, n: Node) -> tuple[object, ...]:
        """What an operator's per-candidate sizes depend on: what its price depends on
        (:func:`~parplan.solver.ilp.costs.signature`: kind, shape, attributes, inputs' shapes, the
        parameters it owns, whether it is in a block) and the dims its split leaves partial.
        Operators alike in this (the same operator of every alike block) have the same sizes under
        each strategy."""
        return (*signature(n, self.gp.ctx), self.gp.partial_dims.get(n.id))

    def _per_candidate_alike(self, op: str, what: Hashable, fn: object) -> Lin:
        """:meth:`_per_candidate` for a term that depends only on the operator's (and its origin's)
        :meth:`signature` and ``what``: computed once for all operators alike."""
        origin = self._origin(op)
        rep = self.gp.rep_of[origin]
        key = (what, self.signature(self.graph.node(op)), self.signature(self.graph.node(origin)), op == origin, rep)
        cache = self.gp.caches.setdefault("per_candidate", {})
        values = cache.get(key)
        if values is None:
            values = cache[key] = self._per_candidate(op, fn).nodes[rep]
        return Lin({rep: values})

    def _per_candidate(self, op: str, fn: object) -> Lin:
        """A term of ``op`` depending on its (origin's) candidate: ``fn(strategy, origin node)``."""
        origin = self._origin(op)
        rep = self.gp.rep_of[origin]
        values = np.array([fn(s, self.graph.node(origin)) for s in self.gp.strategies[rep]],  # type: ignore[operator]
                          dtype=np.float64)
        return Lin({rep: values})

    # ---------------------------------------------------------------- saved tensors
    def item(self, key: str, saver: Node, it: SavedItem) -> Lin:
        """Bytes of saved buffer ``key`` (saved by ``saver``) on one device: in its owner's output
        layout (a partial output: as its first reader receives it), or for a graph input's (token
        ids) in the layout the saver reads it."""
        owner_id, item = self.owner_of.get(key, (it.owner, it))  # items of a view: its producer's
        owner = self.graph.node(owner_id)
        if owner.kind is OpKind.INPUT:
            pos = next(p for p, i in enumerate(saver.inputs) if i == owner_id)

            def at_input(s: OpStrategy, o: Node) -> float:
                lay = _in(self.gp, saver, pos, s)
                return item.total_bytes / lay.shards(self.sizes, item.dims)

            return self._per_candidate_alike(saver.id, ("at_input", pos, item.total_bytes, item.dims), at_input)

        def held(s: OpStrategy, o: Node) -> float:
            lay = _out(self.gp, o, s)
            return owner_saved_bytes(item, lay, self.sizes)

        out = self._per_candidate_alike(owner_id, ("held", item.total_bytes, item.dims, item.reduction), held)
        first = self.first_edge.get(self._origin(owner_id))
        if first is not None:
            out = out.add(self._edge(first, lambda o, i: partial_saved_bytes([item], o, i, self.sizes),
                                     ("partial_saved", item.total_bytes, item.dims, item.reduction)))
        return out

    def kept_copies(self, saver: Node) -> Lin:
        """Copies ``saver`` keeps of inputs it received in another layout (PyTorch's runtime)."""
        out = Lin()
        for edge in self.edges_into.get(saver.id, ()):
            kept = consumer_saves(self.gp, saver.id, edge[2])
            if kept:
                out = out.add(self._edge(edge, lambda o, i, kept=kept: resharded_copy_bytes(kept, o, i, self.sizes),
                                         ("kept", kept)))
        return out

    def received(self, n: Node) -> Lin:
        """Buffers converting ``n``'s inputs to the layouts it reads them in, alive while ``n`` runs
        forward (:func:`~parplan.solver.cost.resharding.conversion_buffer_bytes`), in a runtime that
        makes them (:attr:`~parplan.solver.cost.runtime.Runtime.materialises_conversions`); the last
        one not where ``n`` keeps it for backward (:meth:`kept_copies` counts it then)."""
        out = Lin()
        if not self.gp.ctx.runtime.materialises_conversions:
            return out
        for edge in self.edges_into.get(n.id, ()):
            total, lead = self._edge_tensor(edge)
            kept = consumer_saves(self.gp, n.id, edge[2]) > 0

            def fn(o: TensorLayout, i: TensorLayout, total: float = total, lead: str = lead,
                   kept: bool = kept) -> float:
                before, last = conversion_buffer_bytes(total, o, i, self.sizes, lead)
                return before + (0.0 if kept else last)

            out = out.add(self._edge(edge, fn, ("received", total, lead, kept)))
        return out

    def gradient_conversions(self, n: Node) -> Lin:
        """Buffers converting the gradients of ``n``'s inputs back to their producers' layouts once
        ``n``'s backward has made them (:func:`~parplan.solver.cost.resharding.gradient_conversion_buffer_bytes`:
        DTensor's redistribution in backward, the gradient as the producer receives it included), in
        a runtime that makes them (:attr:`~parplan.solver.cost.runtime.Runtime.materialises_conversions`)."""
        out = Lin()
        if not self.gp.ctx.runtime.materialises_conversions:
            return out
        for edge in self.edges_into.get(n.id, ()):
            if not is_float(self.graph.node(self._origin(edge[0]))):
                continue
            total, lead = self._edge_tensor(edge)

            def fn(o: TensorLayout, i: TensorLayout, p: frozenset[str], total: float = total,
                   lead: str = lead) -> float:
                return sum(gradient_conversion_buffer_bytes(total, o, i, p, self.sizes, lead))

            out = out.add(self._edge(edge, fn, ("gradient_conversion", total, lead), partials=True))
        return out

    def _edge_tensor(self, edge: tuple[str, str, int]) -> tuple[float, str]:
        """(whole bytes, leading dim) of the tensor an edge carries (its origin's output)."""
        src = self.graph.node(self._origin(edge[0]))
        return src.numel * tensor_bytes(src, self.act), src.dims[0][0] if src.dims else ""

    def input_gradients(self, n: Node) -> Lin:
        """The gradients of ``n``'s activation inputs as its backward makes them, in its layouts."""
        runtime = self.gp.ctx.runtime

        def fn(s: OpStrategy, o: Node) -> float:
            return op_input_gradient_bytes(n, self.graph, _IlpSizes(self.gp, s, o), self.act, runtime)

        return self._per_candidate_alike(n.id, "input_gradients", fn)

    def _edge(self, edge: tuple[str, str, int], fn: object, what: Hashable, partials: bool = False) -> Lin:
        """A term of an original edge's class, by the pair of layouts it joins: ``fn(producer's
        layout, consumer's)`` (with ``partials``, ``fn(producer's, consumer's, the axes the consumer
        leaves the gradient partial over)``), the same for every edge of the class given ``what``
        (computed once)."""
        src, dst, pos = edge
        key = (self.gp.rep_of[src], self.gp.rep_of[dst], pos)
        ei = self.gp.edge_index[key]
        cache = self.gp.caches.setdefault("edge_terms", {})
        matrix = cache.get((ei, what))
        if matrix is None:
            outs, ins = self.gp.edge_layouts[ei]
            if partials:
                pairs = list(zip(ins, self.gp.edge_partials[ei], strict=True))
                rows = [[fn(o, i, p) for i, p in pairs] for o in outs]  # type: ignore[operator]
            else:
                rows = [[fn(o, i) for i in ins] for o in outs]  # type: ignore[operator]
            matrix = cache[(ei, what)] = np.array(rows, dtype=np.float64)
        return Lin(edges={ei: matrix})

    # ---------------------------------------------------------------- one operator's backward
    def converted_weights(self, n: Node) -> Lin:
        """Weights ``n`` reads that another operator owns (a tied table), converted to ``n``'s layout:
        a copy alive while ``n`` runs, forward and backward; in a runtime that converts with new
        buffers (:attr:`~parplan.solver.cost.runtime.Runtime.materialises_conversions`) the buffers
        before the copy too (an all-gather's, whose copy is its concatenation): the plan interpreter
        converts the table again in backward, and on gloo the all-gather's buffer is sometimes still
        alive during the reader's backward (measured on gpt-tiny's 4-way min-memory plan). An owner
        that shards the table with ZeRO-3 per operator makes every other reader gather it for
        itself, in its layout, even where the layouts are alike (measured on the same plan)."""
        out = Lin()
        every = self.gp.ctx.runtime.materialises_conversions
        for owner, opos, user, upos in self.gp.param_edges:
            if user != n.id:
                continue
            key = (self.gp.rep_of[owner], opos, self.gp.rep_of[user], upos)
            ei = self.gp.param_edge_index[key]
            owners, users = self.gp.edge_layouts[ei]
            sharded = self.gp.param_edge_sharded[ei]
            w = self.graph.node(n.inputs[upos])
            nbytes = w.numel * self.prec.param_bytes
            lead = w.dims[0][0] if w.dims else ""

            def copies(o: TensorLayout, i: TensorLayout, gathered: bool, nbytes: float = nbytes,
                       lead: str = lead) -> float:
                if o == i and not gathered:
                    return 0.0
                if every and o != i:
                    return sum(conversion_buffer_bytes(nbytes, o, i, self.sizes, lead))
                return nbytes / i.shards(self.sizes)

            rows = [[copies(o, i, z) for i in users] for o, z in zip(owners, sharded, strict=True)]
            out = out.add(Lin(edges={ei: np.array(rows, dtype=np.float64)}))
        return out

    def transient(self, n: Node) -> Lin:
        ctx = self.gp.ctx

        def fn(s: OpStrategy, o: Node) -> float:
            return op_transient_bytes(n, self.graph, _IlpSizes(self.gp, s, o), self.act, self.prec.grad_bytes,
                                      ctx.runtime)

        # (the attention core's rebuilt buffers depend on more than its signature: priced for each)
        own = (self._per_candidate(n.id, fn) if n.kind is OpKind.ATTENTION
               else self._per_candidate_alike(n.id, "transient", fn))
        out = own.add(self.converted_weights(n))
        if ctx.zero3_per_operator:  # the operator's own weights, gathered again for its backward
            out = out.add(self.gathered(n, self.prec.param_bytes, force=True))
        return out

    def weight_grads(self, n: Node, zero3_only: bool, skip: frozenset[str] = frozenset()) -> Lin:
        if zero3_only and self.gp.ctx.zero3_per_operator:
            return Lin()  # reduce-scattered as soon as each operator made them

        def fn(s: OpStrategy, o: Node) -> float:
            if zero3_only and s.zero < 3:
                return 0.0
            sizes = _IlpSizes(self.gp, s, o)
            return sum(sizes.weight_grad(n, pos) for pos, i in enumerate(n.inputs)
                       if self.graph.node(i).is_parameter and i not in skip) * self.prec.grad_bytes

        skipped = tuple(pos for pos, i in enumerate(n.inputs) if i in skip)
        return self._per_candidate_alike(n.id, ("weight_grads", zero3_only, skipped), fn)

    def gathered(self, n: Node, nbytes: int, force: bool = False) -> Lin:
        """Bytes (``nbytes`` per element) of the parameters ``n`` owns, unsharded, when its strategy
        shards them with ZeRO-3 (FSDP gathers them per block; per operator: see ``force``)."""
        if self.gp.ctx.zero3_per_operator and not force:
            return Lin()
        positions = self.gp.ctx.owned_params.get(n.id, ())

        def fn(s: OpStrategy, o: Node) -> float:
            if s.zero < 3:
                return 0.0
            return nbytes * sum(self.graph.node(n.inputs[p]).numel
                                / _shards(self.gp, _in(self.gp, n, p, s)) for p in positions)

        if not positions or n.id in self.gp.follows:
            return Lin()
        return self._per_candidate_alike(n.id, ("gathered", nbytes, tuple(positions)), fn)

    def tied(self, units: Sequence[_HasNodes], zero3_only: bool = False) -> tuple[Lin, Lin, list[int]]:
        """(local gradient bytes of the parameters two units read, the gradient the first reader's
        backward makes for them, the units reading them): a tied embedding; ``zero3_only``: where
        the owner shards them with ZeRO-3."""
        unit_of = {n.id: k for k, u in enumerate(units) for n in u.nodes}
        grad, workspace = Lin(), Lin()
        users: set[int] = set()
        for owner, opos, user, _ in self.gp.param_edges:
            if unit_of.get(owner) == unit_of.get(user):
                continue
            users.update({unit_of[owner], unit_of[user]})
            n = self.graph.node(owner)
            w = self.graph.node(n.inputs[opos])

            def local(s: OpStrategy, o: Node, n: Node = n, w: Node = w, opos: int = opos) -> float:
                if zero3_only and s.zero < 3:
                    return 0.0
                return w.numel / _shards(self.gp, _in(self.gp, n, opos, s)) * self.prec.grad_bytes

            def made(s: OpStrategy, o: Node, n: Node = n, opos: int = opos) -> float:
                return _IlpSizes(self.gp, s, o).weight_grad(n, opos) * self.prec.grad_bytes

            grad = grad.add(self._per_candidate(owner, local))
            workspace = workspace.add(self._per_candidate(owner, made))
        return grad, workspace, sorted(users)

    def optimizer(self, n: Node) -> Lin:
        positions = self.gp.ctx.owned_params.get(n.id, ())

        def fn(s: OpStrategy, o: Node) -> float:
            largest = max((self.graph.node(n.inputs[p]).numel
                           / _shards(self.gp, _in(self.gp, n, p, s)) for p in positions),
                          default=0.0)
            return optimizer_temporary_bytes(largest, self.prec)

        if not positions or n.id in self.gp.follows:
            return Lin()
        return self._per_candidate_alike(n.id, ("optimizer", tuple(positions)), fn)

    def forward_live(self, nodes: Sequence[Node], kept: set[str]) -> list[Lin]:
        """Per operator of a unit (forward order): its unsaved outputs still to be read (as
        :func:`~parplan.solver.cost.backward.forward_transient`), the buffers around it."""
        consumers = self.gp.caches.get("consumers")
        if consumers is None:
            consumers = self.gp.caches["consumers"] = self.graph.consumers()

        def live_size(n: Node) -> Lin | None:
            if n.id in kept or n.kind is OpKind.RESHAPE:
                return None
            if n.kind is not OpKind.INPUT:
                return self._per_candidate_alike(n.id, ("live_output",), lambda s, o: _IlpSizes(self.gp, s, o)
                                                 .output(n) * tensor_bytes(n, self.act))
            # a graph input (token ids, labels): in the layout its first reader takes it
            if not consumers[n.id]:
                return None
            reader = self.graph.node(consumers[n.id][0])
            pos = reader.inputs.index(n.id)
            return self._per_candidate_alike(reader.id, ("live_input", pos), lambda s, o: n.numel * tensor_bytes(
                n, self.act) / _shards(self.gp, _in(self.gp, reader, pos, s)))

        def around(n: Node) -> Lin:
            if n.is_leaf:
                return Lin()
            out = self.converted_weights(n).add(self.received(n))
            if self.gp.ctx.zero3_per_operator:  # the operator's weights, gathered for it
                out = out.add(self.gathered(n, self.prec.param_bytes, force=True))
            return out

        return list(forward_live(LINEAR, nodes, consumers, live_size, around))


class _HasNodes(Protocol):
    @property
    def nodes(self) -> list[Node]: ...


class LinearAlgebra:
    """The step's walk (:mod:`parplan.solver.cost.timeline`) over linear expressions."""

    def zero(self) -> Lin:
        return Lin()

    def add(self, a: Lin, b: Lin, k: float = 1.0) -> Lin:
        return a.add(b, k)


LINEAR = LinearAlgebra()

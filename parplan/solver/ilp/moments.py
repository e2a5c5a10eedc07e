"""The ILP's memory peak: the busiest moment of the step, as the whole-plan evaluator finds it
(:mod:`parplan.solver.cost.peak`), in linear terms of the operators' strategies.

Every quantity the evaluator's walk adds up is a sum of operator terms that each depend on one
operator's strategy (a saved tensor's size on its owner's, a gradient's on the operator that makes
it, a gathered weight on its owner's ZeRO stage) or on one edge's pair of strategies (a tensor
saved as its reader received it), with the per-operator rules of :mod:`parplan.solver.cost.backward`.
So every moment is a linear expression of the choice, and the peak is ``T ≥ moment`` for each:

- forward, at every operator: the saved tensors of the units before, the unit's own, the
  operator's unsaved outputs still to be read, the buffers converting its inputs to the layouts it
  reads them in (the agent's plan interpreter), the gathered weights (ZeRO-3: the unit's own and
  the all-gather buffer; parameters outside the blocks for the whole step);
- a ZeRO-3 block's all-gather: its output buffer and the previous one's, besides the copy;
- backward, at every operator (last unit first): the saved tensors not freed yet, the operator's
  gradients, under ZeRO-3 the unit's unsharded weight gradients so far, the unit's and the
  prefetched unit's gathered weights, the previous block's reduce-scatter buffer; once an
  operator's backward has run, its input gradients and the buffers converting them back to their
  producers' layouts (the agent's plan interpreter); when a ZeRO-3 block ends, its gradients
  copied into that buffer;
- the tied embedding's gradients at the embedding's backward, and Adam's update.

Alike blocks share variables and hold the same terms apart from the activations of the units
before them, which only grow, and the buffers of their neighbours; of a run of alike blocks only
the first two and the last two are written. Memory in bytes per device; one micro-batch in flight
(the ILP plans one pipeline stage).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from parplan.solver.cost.activations import (
    Recompute,
    SavedItem,
    block_of,
    is_float,
    op_saved_items,
    saved_items,
    tensor_bytes,
)
from parplan.solver.cost.backward import (
    BackwardProfile,
    op_input_gradient_bytes,
    op_transient_bytes,
    selective_rebuilt_items,
)
from parplan.solver.cost.layout import TensorLayout
from parplan.solver.cost.op_layout import OpStrategy, input_layout, output_layout
from parplan.solver.cost.peak import StageUnit, stage_peak
from parplan.solver.cost.pipeline import units_of
from parplan.solver.cost.resharding import conversion_buffer_bytes, gradient_conversion_buffer_bytes
from parplan.solver.cost.rules import optimizer_temporary_bytes
from parplan.solver.cost.runtime import FSDP, IN_PLACE
from parplan.solver.ilp.costs import signature
from parplan.solver.ilp.model import AuxProblem, PeakTerm
from parplan.solver.ilp.problem import GraphProblem, consumer_saves, partial_saved_bytes, resharded_copy_bytes
from parplan.solver.ir import Node, OpKind
from parplan.solver.strategy import SEQ_DIMS

_K = TypeVar("_K")


@dataclass
class Lin:
    """A linear expression of the choice: per variable set a value per candidate, per edge a value
    per pair of classes (numpy arrays, never changed in place once made, so expressions share them)."""

    nodes: dict[str, np.ndarray] = field(default_factory=dict)
    edges: dict[int, np.ndarray] = field(default_factory=dict)

    def add(self, other: Lin, k: float = 1.0) -> Lin:
        """A new expression: ``self + k·other``."""
        return Lin(_plus(self.nodes, other.nodes, k), _plus(self.edges, other.edges, k))

    def term(self) -> PeakTerm:
        return PeakTerm(nodes={r: v for r, v in self.nodes.items() if v.any()},
                        edges={e: m for e, m in self.edges.items() if m.any()})


def _plus(a: dict[_K, np.ndarray], b: dict[_K, np.ndarray], k: float) -> dict[_K, np.ndarray]:
    """``a + k·b`` key by key, as a new dict (no array is changed)."""
    out = dict(a)
    for key, v in b.items():
        cur = out.get(key)
        scaled = v if k == 1.0 else k * v
        out[key] = scaled if cur is None else cur + scaled
    return out


def _sum(parts: Iterable[Lin]) -> Lin:
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
    """Per-operator sizes (:class:`~parplan.solver.cost.backward.OpSizes`) of operator ``n`` under
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


class _Terms:
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
            return 0.0 if lay.partial else item.total_bytes / TensorLayout(lay.split).shards(self.sizes, item.dims)

        out = self._per_candidate_alike(owner_id, ("held", item.total_bytes, item.dims), held)
        first = self.first_edge.get(self._origin(owner_id))
        if first is not None:
            out = out.add(self._edge(first, lambda o, i: partial_saved_bytes([item], o, i, self.sizes),
                                     ("partial_saved", item.total_bytes, item.dims)))
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
        alive during the reader's backward (gpt-tiny's 4-way min-memory plan: +1.5% and +1.7% in two
        bench runs, in a loop 1 of 28 rank-runs). An owner that shards the table with ZeRO-3 per
        operator makes every other reader gather it for itself, in its layout, even where the layouts
        are alike (measured: gpt-tiny's 4-way min-memory plan, +0.5% before this was counted)."""
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

    def tied(self, units: list[_Unit]) -> tuple[Lin, Lin, list[int]]:
        """(local gradient bytes of the parameters two units read, the gradient the first reader's
        backward makes for them, the units reading them): a tied embedding."""
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
                return w.numel / _shards(self.gp, _in(self.gp, n, opos, s)) \
                    * self.prec.grad_bytes

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
        :func:`~parplan.solver.cost.backward.forward_transient`)."""
        consumers = self.gp.caches.get("consumers")
        if consumers is None:
            consumers = self.gp.caches["consumers"] = self.graph.consumers()
        local = {n.id for n in nodes}
        remaining = {n.id: len(consumers[n.id]) if all(c in local for c in consumers[n.id]) else -1 for n in nodes}
        live: dict[str, Lin] = {}
        out = []
        for n in nodes:
            if n.id not in kept and n.kind is OpKind.INPUT:
                # a graph input (token ids, labels): in the layout its first reader takes it
                reader = self.graph.node(consumers[n.id][0]) if consumers[n.id] else None
                if reader is not None:
                    pos = reader.inputs.index(n.id)
                    live[n.id] = self._per_candidate_alike(
                        reader.id, ("live_input", pos), lambda s, o, n=n, reader=reader, pos=pos: n.numel
                        * tensor_bytes(n, self.act) / _shards(self.gp, _in(self.gp, reader, pos, s)))
            elif n.id not in kept and n.kind is not OpKind.RESHAPE:
                live[n.id] = self._per_candidate_alike(
                    n.id, ("live_output",), lambda s, o, n=n: _IlpSizes(self.gp, s, o).output(n)
                    * tensor_bytes(n, self.act))
            now = _sum(live.values())
            if not n.is_leaf:
                now = now.add(self.converted_weights(n)).add(self.received(n))
            if self.gp.ctx.zero3_per_operator and not n.is_leaf:  # the operator's weights, gathered for it
                now = now.add(self.gathered(n, self.prec.param_bytes, force=True))
            out.append(now)
            for i in dict.fromkeys(n.inputs):
                if i in remaining and remaining[i] > 0:
                    remaining[i] -= 1
                    if remaining[i] == 0:
                        live.pop(i, None)
        return out


@dataclass
class _Detail:
    """A unit's per-operator figures (only the units whose moments are built, and the answer's walk,
    need them)."""

    # per operator (forward order), then per operator whose input gradients are converted back
    # to their producers' layouts (:meth:`_Terms.gradient_conversions`), that conversion:
    alive: list[Lin]  # saved tensors alive then
    rebuilt_alive: list[Lin]  # the part of them recomputation rebuilt (temporary)
    transient: list[Lin]
    grads_after: list[Lin]  # ZeRO-3 weight gradients its backward has made before then
    forward_live: list[Lin]


@dataclass
class _Unit:
    name: str
    nodes: list[Node]
    is_block: bool
    reps: tuple[str, ...]  # the variable set of each operator (units alike share them)
    act: Lin  # saved tensors of the unit (the stage's shared ones apart)
    grads: Lin  # ZeRO-3 weight gradients of the whole unit
    grads_untied: Lin  # the same without a tied table's (outside the blocks: kept to the end of backward)
    gathered: Lin  # ZeRO-3 weights, unsharded
    build_detail: Callable[[], _Detail] = field(repr=False)
    _detail: _Detail | None = field(default=None, repr=False)

    @property
    def detail(self) -> _Detail:
        """The per-operator figures, built on first use."""
        if self._detail is None:
            self._detail = self.build_detail()
        return self._detail


def walk_peak(gp: GraphProblem, choice: dict[str, int]) -> tuple[float, float]:
    """(bytes above the model states at the step's busiest moment, the temporaries' peak) of a
    choice, by the whole-plan evaluator's own walk (:func:`parplan.solver.cost.peak.stage_peak`)
    over every unit's figures at that choice: the independent check of the ILP's moments."""
    terms, units = _terms_and_units(gp)
    problem = gp.problem

    def v(x: Lin) -> float:
        return x.term().value(problem, choice)

    tied, tied_workspace, tied_users = terms.tied(units)
    stage: list[StageUnit] = []
    for k, u in enumerate(units):
        d = u.detail
        alive = [v(a) for a in d.alive]
        rebuilt = [v(a) for a in d.rebuilt_alive]
        trans = [v(t) for t in d.transient]
        grads = [v(g) for g in d.grads_after]
        profile = BackwardProfile(max(a + t for a, t in zip(alive, trans, strict=True)),
                                  max(a + t + g for a, t, g in zip(alive, trans, grads, strict=True)),
                                  max(r + t for r, t in zip(rebuilt, trans, strict=True)),
                                  max(r + t + g for r, t, g in zip(rebuilt, trans, grads, strict=True)))
        gathered = v(u.gathered)
        stage.append(StageUnit(u.name, u.is_block, FSDP if gathered > 0 else IN_PLACE, v(u.act), profile,
                               max((v(x) for x in d.forward_live), default=0.0), gathered, v(u.grads), gathered,
                               v(u.grads_untied), k in tied_users))
    grad_bytes = gp.ctx.precision.grad_bytes
    walked = stage_peak(stage, gp.ctx.precision, v(_shared_items(gp, terms)), v(tied) / grad_bytes,
                        v(tied_workspace) / grad_bytes)
    optimizer = max((v(terms.optimizer(n)) for u in units for n in u.nodes), default=0.0)
    fixed = problem.fixed_bytes
    return max(walked.above_resident, optimizer) + fixed, max(walked.temporary, optimizer) + fixed


def add_moment_terms(gp: GraphProblem) -> None:
    """Replace the problem's memory terms by the step's moments: node memory keeps the model states
    only, edge memory moves into the moments, and ``T ≥`` every moment (see the module docstring)."""
    terms, units = _terms_and_units(gp)
    shared = _shared_items(gp, terms)
    # only the moments that can be the largest are built (see _dominant_units)
    moments = list(_moments(gp, terms, units, shared, _dominant_units(units)))
    problem: AuxProblem = gp.problem
    for e in problem.edges:
        e.memory = None
    problem.peaks = [m.term() for m in moments]


def temporary_terms(gp: GraphProblem) -> list[PeakTerm]:
    """The temporaries of every moment of the step (reported, not optimised), built on first use."""
    if "temporaries" not in gp.caches:
        terms, units = _terms_and_units(gp)
        gp.caches["temporaries"] = [t.term() for t in _temporaries(gp, terms, units)]
    return gp.caches["temporaries"]  # type: ignore[no-any-return]


def _terms_and_units(gp: GraphProblem) -> tuple[_Terms, list[_Unit]]:
    """The problem's terms and units, built once (building the moments and walking a choice use the
    same ones; they depend on the problem only)."""
    if "units" not in gp.caches:
        terms = _Terms(gp)
        gp.caches["units"] = (terms, _units(gp, terms))
    return gp.caches["units"]  # type: ignore[no-any-return]

def _units(gp: GraphProblem, terms: _Terms) -> list[_Unit]:
    ctx = gp.ctx
    graph = ctx.graph
    act = ctx.precision.activation_bytes
    by_unit: dict[str, list[Node]] = {u: [] for u in units_of(graph)}
    for n in graph.nodes:
        if not n.is_leaf:
            by_unit.setdefault(n.layer or "", []).append(n)
    shared_keys = _shared_keys(gp)
    in_order: dict[str, list[Node]] = {}  # a unit's operators and graph inputs, in graph order
    for n in graph.nodes:
        if not n.is_parameter:
            in_order.setdefault(n.layer or "", []).append(n)
    every_saved = {it.key for n in graph.nodes if not n.is_leaf
                   for it in saved_items(graph, [n], act, flash_attention=ctx.flash_attention, recompute=ctx.recompute,
                                         runtime=ctx.runtime)}
    out = []
    for name, nodes in by_unit.items():
        if not nodes:
            continue
        is_block = block_of(nodes[0]) is not None
        rebuilt = is_block and ctx.recompute is Recompute.FULL
        policy = Recompute.NONE if rebuilt else ctx.recompute
        kept_keys = {it.key for it in saved_items(graph, nodes, act, flash_attention=ctx.flash_attention,
                                                   recompute=ctx.recompute, runtime=ctx.runtime)}
        unit_act = Lin()
        seen: set[str] = set()
        saver: dict[str, Node] = {}  # saved buffer -> the first operator of the unit that saves it
        for n in nodes:
            for it in saved_items(graph, [n], act, flash_attention=ctx.flash_attention, recompute=ctx.recompute,
                                  runtime=ctx.runtime):
                saver.setdefault(it.key, n)
        for it in saved_items(graph, nodes, act, flash_attention=ctx.flash_attention, recompute=ctx.recompute,
                              runtime=ctx.runtime):
            if it.key in seen or it.key in shared_keys:
                continue
            seen.add(it.key)
            unit_act = unit_act.add(terms.item(it.key, saver.get(it.key, nodes[0]), it))
        for n in nodes:
            unit_act = unit_act.add(terms.kept_copies(n))
        acc = _sum(terms.weight_grads(n, zero3_only=True) for n in nodes)
        untied = _sum(terms.weight_grads(n, zero3_only=True, skip=terms.tied_ids) for n in nodes)
        gathered = _sum(terms.gathered(n, ctx.precision.param_bytes) for n in nodes)

        def detail(nodes: list[Node] = nodes, name: str = name, rebuilt: bool = rebuilt, policy: Recompute = policy,
                   kept_keys: set[str] = kept_keys) -> _Detail:
            freed: list[tuple[Lin, Lin]] = []  # per operator: (saved tensors it frees, of them rebuilt)
            seen: set[str] = set()
            for n in nodes:
                mine, mine_rebuilt = Lin(), Lin()
                for it in op_saved_items(n, graph, act, flash_attention=ctx.flash_attention, recompute=policy,
                                         runtime=ctx.runtime):
                    if it.key in seen or it.key in shared_keys:
                        continue
                    seen.add(it.key)
                    size = terms.item(it.key, n, it)
                    mine = mine.add(size)
                    if rebuilt and it.key not in kept_keys:
                        mine_rebuilt = mine_rebuilt.add(size)
                mine = mine.add(terms.kept_copies(n))
                freed.append((mine, mine_rebuilt))
            alive, rebuilt_alive = [], []
            running, running_r = Lin(), Lin()
            for mine, mine_r in freed:  # forward order: alive at the operator = itself and the earlier ones
                running, running_r = running.add(mine), running_r.add(mine_r)
                alive.append(running)
                rebuilt_alive.append(running_r)
            grads_after: list[Lin] = [Lin()] * len(nodes)
            made = Lin()
            for k in reversed(range(len(nodes))):
                grads_after[k] = made
                made = made.add(terms.weight_grads(nodes[k], zero3_only=True))
            transient = [terms.transient(n) for n in nodes]
            # once an operator's backward has run (its saved tensors freed, its weight gradients
            # made), the conversions of its input gradients back to their producers' layouts
            for k, n in enumerate(nodes):
                conv = terms.gradient_conversions(n)
                if not any(m.any() for m in conv.edges.values()):
                    continue
                alive.append(alive[k - 1] if k else Lin())
                rebuilt_alive.append(rebuilt_alive[k - 1] if k else Lin())
                transient.append(terms.input_gradients(n).add(conv))
                grads_after.append(grads_after[k].add(terms.weight_grads(n, zero3_only=True)))
            return _Detail(alive, rebuilt_alive, transient, grads_after,
                           terms.forward_live(in_order.get(name, []), every_saved))

        out.append(_Unit(name, nodes, is_block, tuple(gp.rep_of[n.id] for n in nodes), unit_act, acc, untied,
                         gathered, detail))
    return out


def _shared_keys(gp: GraphProblem) -> set[str]:
    ctx = gp.ctx
    savers: dict[str, set[str]] = {}
    by_unit: dict[str, list[Node]] = {}
    for n in ctx.graph.nodes:
        if not n.is_leaf:
            by_unit.setdefault(n.layer or "", []).append(n)
    for u, nodes in by_unit.items():
        for it in saved_items(ctx.graph, nodes, ctx.precision.activation_bytes, flash_attention=ctx.flash_attention,
                              recompute=ctx.recompute, runtime=ctx.runtime):
            savers.setdefault(it.key, set()).add(u)
    return {k for k, us in savers.items() if len(us) > 1}


def _shared_items(gp: GraphProblem, terms: _Terms) -> Lin:
    """Saved buffers several units save (freed only at the end)."""
    ctx = gp.ctx
    shared = _shared_keys(gp)
    out = Lin()
    seen: set[str] = set()
    for n in ctx.graph.nodes:
        if n.is_leaf:
            continue
        for it in saved_items(ctx.graph, [n], ctx.precision.activation_bytes, flash_attention=ctx.flash_attention,
                              recompute=ctx.recompute, runtime=ctx.runtime):
            if it.key in shared and it.key not in seen:
                seen.add(it.key)
                out = out.add(terms.item(it.key, n, it))
    return out


@dataclass
class _Moment:
    total: Lin
    unit: int  # the unit it belongs to (for keeping the dominant ones)
    kind: str

    def term(self) -> PeakTerm:
        return self.total.term()


def _moments(gp: GraphProblem, terms: _Terms, units: list[_Unit], shared: Lin,
             keep: set[int] | None = None) -> Iterable[_Moment]:
    """Every moment of the walk (:func:`parplan.solver.cost.peak.stage_peak` with one micro-batch),
    or only those of the units in ``keep`` (the others' are not built)."""

    def want(i: int) -> bool:
        return keep is None or i in keep

    pbytes = gp.ctx.precision.param_bytes
    blocks = [i for i, u in enumerate(units) if u.is_block]
    root_params = _sum(u.gathered for u in units if not u.is_block)
    held_before = [shared]
    for u in units[:-1]:
        held_before.append(held_before[-1].add(u.act))
    del pbytes
    # forward
    for i, u in enumerate(units):
        before = [j for j in blocks if j <= i]
        weights = Lin()
        if before:
            last = before[-1]
            weights = units[last].gathered.add(units[last].gathered) if last == i else units[last].gathered
        if not want(i):
            continue
        fixed = root_params.add(weights)
        base = held_before[i].add(u.act).add(fixed)
        for live in u.detail.forward_live:
            yield _Moment(base.add(live), i, "forward")
        if i in blocks:
            yield _Moment(held_before[i].add(_gather_buffers(units, blocks, i, root_params)), i, "gather")
    # backward
    tied, tied_workspace, tied_users = terms.tied(units)
    root_grads = Lin()
    reduce_buffer = Lin()
    pending = Lin()  # the LM head's gradient of a tied table, waiting for the embedding's
    for i in reversed(range(len(units))):
        u = units[i]
        weights = _weights_in_backward(units, blocks, i)
        if want(i):
            fixed = root_params.add(root_grads).add(weights).add(reduce_buffer).add(pending)
            d = u.detail
            for k in range(len(d.alive)):
                own = d.alive[k].add(d.transient[k]).add(d.grads_after[k])
                yield _Moment(held_before[i].add(fixed).add(own), i, "backward")
        if u.is_block:
            reduce_buffer = u.grads
            if want(i):
                yield _Moment(held_before[i].add(root_params).add(root_grads).add(weights).add(u.gathered, -1)
                              .add(u.grads, 2).add(pending), i, "block end")
        else:
            root_grads = root_grads.add(u.grads_untied)
        if tied_users and i == tied_users[-1] and len(tied_users) > 1:
            pending = tied
        if tied_users and i == tied_users[0]:
            # the first user's own gradient of the table, the one waiting, and their sum
            if want(i):
                yield _Moment(held_before[i].add(root_params).add(root_grads).add(weights).add(reduce_buffer)
                              .add(pending).add(tied).add(tied_workspace), i, "tied")
            pending = Lin()
    # Adam's update, after the activations are freed
    for i, u in enumerate(units):
        for n in u.nodes if want(i) else ():
            opt = terms.optimizer(n)
            if opt.nodes:
                yield _Moment(opt, i, "optimizer")


def _temporaries(gp: GraphProblem, terms: _Terms, units: list[_Unit]) -> Iterable[Lin]:
    """The temporaries of every moment (the walk's temporary peak, reported, not optimised)."""
    blocks = [i for i, u in enumerate(units) if u.is_block]
    root_params = _sum(u.gathered for u in units if not u.is_block)
    for i, u in enumerate(units):
        before = [j for j in blocks if j <= i]
        weights = Lin()
        if before:
            last = before[-1]
            weights = units[last].gathered.add(units[last].gathered) if last == i else units[last].gathered
        for live in u.detail.forward_live:
            yield root_params.add(weights).add(live)
        if i in blocks:
            yield _gather_buffers(units, blocks, i, root_params)
    tied, tied_workspace, tied_users = terms.tied(units)
    root_grads = Lin()
    reduce_buffer = Lin()
    pending = Lin()
    for i in reversed(range(len(units))):
        u = units[i]
        weights = _weights_in_backward(units, blocks, i)
        fixed = root_params.add(root_grads).add(weights).add(reduce_buffer).add(pending)
        d = u.detail
        for k in range(len(d.alive)):
            yield fixed.add(d.rebuilt_alive[k]).add(d.transient[k]).add(d.grads_after[k])
        if u.is_block:
            reduce_buffer = u.grads
            yield root_params.add(root_grads).add(weights).add(u.gathered, -1).add(u.grads, 2).add(pending)
        else:
            root_grads = root_grads.add(u.grads_untied)
        if tied_users and i == tied_users[-1] and len(tied_users) > 1:
            pending = tied
        if tied_users and i == tied_users[0]:
            yield root_params.add(root_grads).add(weights).add(reduce_buffer).add(pending).add(tied).add(
                tied_workspace)
            pending = Lin()
    for u in units:
        for n in u.nodes:
            opt = terms.optimizer(n)
            if opt.nodes:
                yield opt


def _gather_buffers(units: list[_Unit], blocks: list[int], i: int, root_params: Lin) -> Lin:
    """Weights alive at block ``i``'s ZeRO-3 all-gather: its copy and output buffer, and the previous
    all-gather's (the last block before it, or the parameters outside the blocks)."""
    earlier = [j for j in blocks if j < i]
    previous = units[earlier[-1]].gathered if earlier else root_params
    return root_params.add(units[i].gathered, 2).add(previous)


def _weights_in_backward(units: list[_Unit], blocks: list[int], i: int) -> Lin:
    """ZeRO-3 weights gathered while unit ``i``'s backward runs: a block's own and the prefetched
    previous block's; after the blocks, the last block's (still gathered from forward)."""
    earlier = [j for j in blocks if j < i]
    if units[i].is_block:
        return units[i].gathered.add(units[earlier[-1]].gathered) if earlier else units[i].gathered
    return units[earlier[-1]].gathered if earlier else Lin()


def _dominant_units(units: list[_Unit]) -> set[int]:
    """The units whose moments can be the largest: in a run of blocks alike (same variables), the
    moments of a block hold the same terms as another's plus the activations of more units before,
    except near the ends of the run; keep the first two and the last two blocks of each run."""
    keep: set[int] = set()
    i = 0
    while i < len(units):
        j = i
        while j + 1 < len(units) and units[j + 1].is_block and units[i].is_block and _alike(units[i], units[j + 1]):
            j += 1
        keep.update({i, min(i + 1, j), max(i, j - 1), j})
        i = j + 1
    return keep


def _alike(a: _Unit, b: _Unit) -> bool:
    return a.reps == b.reps

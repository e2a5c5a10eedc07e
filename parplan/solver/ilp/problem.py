"""Build the auxiliary problem of a graph on a mesh, with repeated layers sharing variables.

Operators of structurally identical units (``layers.0`` ... ``layers.N``: the same operators,
shapes and wiring, see :class:`~parplan.solver.cost.units.GraphCosts`) map to the operator at the
same position of the first such unit; the ILP decides for that representative and the choice
applies to every copy. Each copy is priced as what it is: copies whose outputs are used alike
(``layers.0`` ... ``layers.N-1``) cost the same and are priced once and counted, while the last
block, whose output feeds the head and so saves other buffers, is priced on its own, under the
same variables. Original edges map to classes ``(rep producer, rep consumer, argument position)``;
a class's costs are counted once per original edge in it.

Zero-cost views (``reshape``) with a single producer *follow* it: they take the layout their
producer gives them and are not ILP variables. This loses nothing: a view costs nothing itself, and
converting a layout directly never costs more than through an intermediate one (the per-axis
resharding costs obey the triangle inequality), so whatever the view would do is done as well by
its consumers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from parplan.solver.calibration import Calibration
from parplan.solver.cluster import GpuSpec, MeshLinks
from parplan.solver.cost.activations import SCATTERED, Recompute, SavedItem, op_saved_items, saved_items
from parplan.solver.cost.activations import tensor_bytes as elem_bytes
from parplan.solver.cost.layout import TensorLayout
from parplan.solver.cost.op_layout import renaming
from parplan.solver.cost.precision import Precision
from parplan.solver.cost.resharding import edge_seconds, reshard_seconds
from parplan.solver.cost.runtime import Runtime
from parplan.solver.cost.units import GraphCosts
from parplan.solver.ilp.costs import IlpContext, StrategyCost, op_cost
from parplan.solver.ilp.graph_problem import GraphProblem as GraphProblem
from parplan.solver.ilp.graph_problem import consumer_saves as consumer_saves
from parplan.solver.ilp.graph_problem import origin_of, source_layout
from parplan.solver.ilp.graph_problem import partial_saved_bytes as partial_saved_bytes
from parplan.solver.ilp.graph_problem import resharded_copy_bytes as resharded_copy_bytes
from parplan.solver.ilp.model import AuxEdge, AuxNode, AuxProblem
from parplan.solver.ilp.moments import add_moment_terms
from parplan.solver.ilp.strategies import (
    Mesh,
    OpStrategy,
    candidate_strategies,
    input_layout,
    loop_dims,
    output_layout,
    partial_gradient_axes,
)
from parplan.solver.ir import Graph, Node, OpKind

_K = TypeVar("_K")


def _owners(graph: Graph, ops: list[Node]) -> dict[str, list[int]]:
    """Each parameter is owned by the first operator reading it: op -> input positions."""
    owned: dict[str, list[int]] = {}
    seen: set[str] = set()
    for n in ops:
        for pos, i in enumerate(n.inputs):
            if graph.node(i).is_parameter and i not in seen:
                seen.add(i)
                owned.setdefault(n.id, []).append(pos)
    return owned


def _saved(graph: Graph, ops: list[Node], act_bytes: int, recompute: Recompute, flash: bool,
           runtime: Runtime, fp8: bool) -> tuple[dict[str, list[SavedItem]], dict[str, list[tuple[int, SavedItem]]]]:
    """Saved buffers by owning operator, and input-owned ones by the operator that saves them."""
    by_owner: dict[str, list[SavedItem]] = {}
    at_input: dict[str, list[tuple[int, SavedItem]]] = {}
    seen: set[str] = set()
    for n in ops:
        items = (saved_items(graph, [n], act_bytes, flash_attention=flash, recompute=recompute, runtime=runtime,
                             fp8_inputs=fp8)
                 if recompute.rebuilds_blocks else
                 op_saved_items(n, graph, act_bytes, flash_attention=flash, recompute=recompute, runtime=runtime,
                                fp8_inputs=fp8))
        for it in items:
            if it.key in seen:
                continue
            seen.add(it.key)
            owner = graph.node(it.owner)
            if owner.kind is OpKind.INPUT:
                at_input.setdefault(n.id, []).append((n.inputs.index(owner.id), it))
            else:
                by_owner.setdefault(owner.id, []).append(it)
    return by_owner, at_input


def build_problem(graph: Graph, mesh: Mesh, links: MeshLinks, gpu: GpuSpec, calibration: Calibration,
                  precision: Precision, microbatches: int, recompute: Recompute, flash_attention: bool,
                  zero_stages: tuple[int, ...] = (0, 1, 2, 3), max_strategies: int | None = None,
                  follow_views: bool = True, prune: bool = True, runtime: Runtime = Runtime.MEGATRON,
                  zero3_per_operator: bool = False) -> GraphProblem:
    """The auxiliary problem of ``graph`` (built for one micro-batch) on ``mesh``.

    ``max_strategies`` caps the candidates per operator (after dropping dominated ones) by keeping
    the least-memory and the fastest halves; None keeps all (exact). ``prune=False`` keeps even
    dominated candidates (to price a given plan)."""
    gp = build_choices(graph, mesh, links, gpu, calibration, precision, microbatches, recompute, flash_attention,
                       zero_stages, max_strategies, follow_views, prune, runtime, zero3_per_operator)
    complete_problem(gp)
    return gp


def build_choices(graph: Graph, mesh: Mesh, links: MeshLinks, gpu: GpuSpec, calibration: Calibration,
                  precision: Precision, microbatches: int, recompute: Recompute, flash_attention: bool,
                  zero_stages: tuple[int, ...] = (0, 1, 2, 3), max_strategies: int | None = None,
                  follow_views: bool = True, prune: bool = True, runtime: Runtime = Runtime.MEGATRON,
                  zero3_per_operator: bool = False) -> GraphProblem:
    """The first half of :func:`build_problem`: the variable sets, their candidates and each
    candidate's model states and seconds, without the edges and the moments
    (:func:`complete_problem`). Enough for :meth:`AuxProblem.seconds_lower_bound` and for
    :meth:`AuxProblem.memory_lower_bound` without the moments (a weaker bound), so that a search can
    rule a candidate out before paying for the rest of its problem."""
    ops = [n for n in graph.nodes if not n.is_leaf]
    owned = _owners(graph, ops)
    by_owner, at_input = _saved(graph, ops, precision.activation_bytes, recompute, flash_attention, runtime,
                                precision.te_fp8)
    ctx = IlpContext(graph, mesh, links, gpu, calibration, precision, microbatches, recompute, flash_attention,
                     owned, by_owner, at_input, runtime, zero3_per_operator)
    gc = GraphCosts(graph)
    rep_of = gc.node_representatives(structural=True)  # the operator whose variables it uses
    price_of = gc.node_representatives()  # the operator that costs what it costs
    partial = {n.id: loop_dims(n, graph)[1] for n in ops}
    follows = {n.id: n.inputs[0] for n in ops if follow_views and renaming(graph, n) is not None
               and not graph.node(n.inputs[0]).is_leaf and not partial[n.inputs[0]]}
    if follows:
        by_owner = _charge_views_to_origins(graph, by_owner, follows)
        ctx = IlpContext(graph, mesh, links, gpu, calibration, precision, microbatches, recompute, flash_attention,
                         owned, by_owner, at_input, runtime, zero3_per_operator)
    copies: dict[str, dict[str, int]] = {}
    for n in ops:
        if n.id not in follows:
            priced_as = copies.setdefault(rep_of[n.id], {})
            priced_as[price_of[n.id]] = priced_as.get(price_of[n.id], 0) + 1
    strategies: dict[str, list[OpStrategy]] = {}
    costs: dict[str, list[StrategyCost]] = {}
    problem = AuxProblem(fixed_bytes=runtime.held_through_step_bytes)
    for rep, priced_as in copies.items():
        node = graph.node(rep)
        cands = candidate_strategies(node, graph, mesh, bool(owned.get(rep)), zero_stages)
        priced = [(s, _sum_costs([op_cost(graph.node(p), s, ctx, partial[p]).times(k) for p, k in priced_as.items()]))
                  for s in cands]
        if prune:
            priced = _pareto(node, graph, mesh, priced)
        if max_strategies is not None and len(priced) > max_strategies:
            priced = _cap(priced, max_strategies)
        strategies[rep] = [s for s, _ in priced]
        costs[rep] = [c for _, c in priced]
        # memory beyond the model states is in the moments (:func:`complete_problem`)
        problem.nodes[rep] = AuxNode(rep, [c.memory.model_states for c in costs[rep]], [c.seconds for c in costs[rep]])
    edges = _edges(graph, ops, follows)
    param_edges = _param_edges(graph, ops, owned)
    return GraphProblem(problem, ctx, ops, rep_of, copies, strategies, costs, partial, follows, edges, param_edges)


def complete_problem(gp: GraphProblem) -> None:
    """The second half of :func:`build_problem`: the edges (conversion seconds, copies held) and the
    step's moments (:mod:`.moments`). Does nothing when done already."""
    if gp.complete:
        return
    gp.complete = True
    problem, graph, ctx = gp.problem, gp.ctx.graph, gp.ctx
    mesh, links, precision, microbatches = ctx.mesh, ctx.links, ctx.precision, ctx.microbatches
    edges, param_edges, follows, rep_of, strategies = gp.edges, gp.param_edges, gp.follows, gp.rep_of, gp.strategies
    classes: dict[tuple[str, str, int], int] = {}
    tensors_read: dict[tuple[str, str, int], set[str]] = {}  # edge class -> the tensors its edges read
    for src, dst, pos in edges:
        key = (rep_of[src], rep_of[dst], pos)
        classes[key] = classes.get(key, 0) + 1
        tensors_read.setdefault(key, set()).add(origin_of(src, follows))
    sizes = mesh.sizes
    converted: dict[tuple[float, TensorLayout, TensorLayout, frozenset[str]], float] = {}

    def conversion(total: float, o: TensorLayout, i: TensorLayout, p: frozenset[str]) -> float:
        """``edge_seconds`` of one micro-batch, remembered (edge classes share many layout pairs)."""
        key = (total, o, i, p)
        if key not in converted:
            converted[key] = edge_seconds(total, o, i, p, sizes, links)
        return converted[key]

    readers: dict[frozenset[str], list[int]] = {}  # the tensors some edge classes read -> those classes
    first_reader: dict[str, tuple[str, str, int]] = {}  # tensor -> its first reading edge
    for edge in edges:
        first_reader.setdefault(origin_of(edge[0], follows), edge)
    for (src, dst, pos), count in classes.items():
        tensor = graph.node(origin_of(src, follows))
        consumer = graph.node(dst)
        total = tensor.numel * elem_bytes(tensor, precision.activation_bytes)
        origin = rep_of[origin_of(src, follows)]
        outs = [source_layout(gp, src, s) for s in range(len(strategies[origin]))]
        # the consumer's side of the edge: the layout it needs and the axes its gradient comes out partial over
        ins = [(input_layout(consumer, pos, graph, t, mesh), partial_gradient_axes(consumer, pos, graph, t, mesh))
               for t in strategies[dst]]
        out_classes, out_reps = _classes(outs)
        in_classes, in_reps = _classes(ins)
        secs = [[microbatches * conversion(total, o, i, p) for i, p in in_reps] for o in out_reps]
        kept = consumer_saves(gp, dst, pos)
        first = (src, dst, pos) == first_reader.get(origin_of(src, follows))
        saved = gp.ctx.saved_by_owner.get(origin_of(src, follows), ()) if first else ()
        held_copies = ([[resharded_copy_bytes(kept, o, i, sizes) + partial_saved_bytes(saved, o, i, sizes)
                         for i, _ in in_reps] for o in out_reps] if kept or saved else None)
        problem.edges.append(AuxEdge(origin, dst, secs, held_copies, count, out_classes, in_classes))
        gp.edge_index[(src, dst, pos)] = len(problem.edges) - 1
        gp.edge_layouts[len(problem.edges) - 1] = (out_reps, [lay for lay, _ in in_reps])
        gp.edge_partials[len(problem.edges) - 1] = [p for _, p in in_reps]
        readers.setdefault(frozenset(tensors_read[(src, dst, pos)]), []).append(len(problem.edges) - 1)
    problem.shared = [group for group in readers.values() if len(group) > 1]
    pclasses: dict[tuple[str, int, str, int], int] = {}
    for owner, opos, user, upos in param_edges:
        pkey = (rep_of[owner], opos, rep_of[user], upos)
        pclasses[pkey] = pclasses.get(pkey, 0) + 1
    for (owner, opos, user, upos), count in pclasses.items():
        param = graph.node(graph.node(owner).inputs[opos])
        total = param.numel * precision.weight_transfer_bytes
        # the owner's side: its layout of the parameter and whether it shards it with ZeRO-3 per
        # operator (the other reader then gathers it for itself, forward and backward)
        owner_keys = [(input_layout(graph.node(owner), opos, graph, s, mesh), ctx.zero3_per_operator and s.zero >= 3)
                      for s in strategies[owner]]
        user_layouts = [input_layout(graph.node(user), upos, graph, t, mesh) for t in strategies[user]]
        owner_classes, owner_reps = _classes(owner_keys)
        user_classes, user_reps = _classes(user_layouts)
        secs = [[microbatches * reshard_seconds(total, o, i, sizes, links) for i in user_reps] for o, _ in owner_reps]
        problem.edges.append(AuxEdge(owner, user, secs, None, count, owner_classes, user_classes))
        gp.param_edge_index[(owner, opos, user, upos)] = len(problem.edges) - 1
        gp.edge_layouts[len(problem.edges) - 1] = ([o for o, _ in owner_reps], user_reps)
        gp.param_edge_sharded[len(problem.edges) - 1] = [z for _, z in owner_reps]
    add_moment_terms(gp)


def least_bytes(graph: Graph, devices: int, precision: Precision, recompute: Recompute, flash_attention: bool,
                runtime: Runtime = Runtime.MEGATRON) -> float:
    """Bytes per device every plan of ``graph`` (one micro-step) on ``devices`` holds at least,
    known before its problem is built: every parameter's states and every saved buffer cut into at
    most ``devices`` pieces, all at the end of the forward pass (one of the step's moments), and
    the runtime's workspaces. Above the budget, the problem need not be built."""
    states = sum(n.numel for n in graph.nodes if n.is_parameter) * precision.model_state_bytes
    saved: dict[str, float] = {}
    ops = [n for n in graph.nodes if not n.is_leaf]
    for it in saved_items(graph, ops, precision.activation_bytes, flash_attention=flash_attention,
                          recompute=recompute, runtime=runtime, fp8_inputs=precision.te_fp8):
        if it.reduction != SCATTERED:  # (none without a reduce-scatter)
            saved.setdefault(it.key, it.total_bytes)
    return runtime.held_through_step_bytes + (states + sum(saved.values())) / devices


def _param_edges(graph: Graph, ops: list[Node], owned: Mapping[str, list[int]]) -> list[tuple[str, int, str, int]]:
    """A parameter read by several operators (a tied embedding) lives in its owner's layout; every
    other reader needs it in its own layout, converted each micro-batch (weights forward, gradients
    back)."""
    owner_of: dict[str, tuple[str, int]] = {}
    for op, positions in owned.items():
        for pos in positions:
            owner_of[graph.node(op).inputs[pos]] = (op, pos)
    out = []
    for n in ops:
        for pos, i in enumerate(n.inputs):
            if i in owner_of and owner_of[i][0] != n.id:
                out.append((owner_of[i][0], owner_of[i][1], n.id, pos))
    return out


def _charge_views_to_origins(graph: Graph, by_owner: dict[str, list[SavedItem]],
                             follows: Mapping[str, str]) -> dict[str, list[SavedItem]]:
    """Buffers saved of a view's output are the origin's tensor under other names: charge them to
    the origin, with the dims named as the origin names them."""
    out = {k: list(v) for k, v in by_owner.items() if k not in follows}
    for view in follows:
        origin, names = view, dict[str, str]()
        while origin in follows:
            rename = renaming(graph, graph.node(origin)) or {}
            back = {b: a for a, b in rename.items()}
            names = {k: back.get(v, v) for k, v in names.items()} if names else dict(back)
            origin = follows[origin]
        for it in by_owner.get(view, ()):
            dims = None if it.dims is None else frozenset(names.get(d, d) for d in it.dims)
            out.setdefault(origin, []).append(SavedItem(it.key, origin, it.numel, it.elem_bytes, dims))
    return out


def _classes(layouts: list[_K]) -> tuple[list[int], list[_K]]:
    """Class index of each layout (equal layouts share one) and one layout per class."""
    index: dict[_K, int] = {}
    for lay in layouts:
        index.setdefault(lay, len(index))
    return [index[lay] for lay in layouts], list(index)


def _edges(graph: Graph, ops: list[Node], follows: Mapping[str, str]) -> list[tuple[str, str, int]]:
    """(producer, consumer, position) of every operator-to-operator edge; views are skipped over."""
    is_op = {n.id for n in ops}
    out = []
    for n in ops:
        if n.id in follows:
            continue
        for pos, i in enumerate(n.inputs):
            if i in is_op:
                out.append((i, n.id, pos))
    return out


def _sum_costs(parts: list[StrategyCost]) -> StrategyCost:
    total = parts[0]
    for c in parts[1:]:
        total = total + c
    return total


def _cap(priced: list[tuple[OpStrategy, StrategyCost]], k: int) -> list[tuple[OpStrategy, StrategyCost]]:
    """The ``k // 2`` least-memory and the ``k - k // 2`` fastest candidates (a heuristic cap)."""
    by_mem = sorted(range(len(priced)), key=lambda i: (priced[i][1].memory_bytes, priced[i][1].seconds))
    by_time = sorted(range(len(priced)), key=lambda i: (priced[i][1].seconds, priced[i][1].memory_bytes))
    keep: dict[int, None] = dict.fromkeys(by_mem[: k // 2])
    for i in by_time:
        if len(keep) >= k:
            break
        keep.setdefault(i, None)
    return [priced[i] for i in sorted(keep)]


def _pareto(node: Node, graph: Graph, mesh: Mesh,
            priced: list[tuple[OpStrategy, StrategyCost]]) -> list[tuple[OpStrategy, StrategyCost]]:
    """Drop strategies another strategy with the same layouts and ZeRO-3 choice beats on both memory
    and time."""
    groups: dict[tuple[object, ...], list[tuple[OpStrategy, StrategyCost]]] = {}
    for s, c in priced:
        # same layouts and the same ZeRO-3 choice (what the step's moments depend on, see .moments)
        key = (output_layout(node, s, mesh, loop_dims(node, graph)[1]),
               tuple(input_layout(node, p, graph, s, mesh) for p in range(len(node.inputs))), s.zero >= 3)
        groups.setdefault(key, []).append((s, c))
    kept = []
    for members in groups.values():
        for s, c in members:
            dominated = any(
                (o.memory_bytes <= c.memory_bytes and o.seconds <= c.seconds)
                and (o.memory_bytes < c.memory_bytes or o.seconds < c.seconds or t.zero < s.zero)
                for t, o in members if t is not s)
            if not dominated:
                kept.append((s, c))
    return kept

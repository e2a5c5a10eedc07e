"""A unit's communication inside its tensor-, context- and expert-parallel groups, one micro-batch:
the seconds :class:`~parplan.solver.cost.units.GraphCosts` adds to a unit's time (data-parallel and
pipeline communication are the plan's, priced elsewhere)."""

from __future__ import annotations

import math
from collections.abc import Iterable

from parplan.solver.cluster import Link
from parplan.solver.cost.activations import Recompute, tensor_bytes
from parplan.solver.cost.collectives import all_reduce_seconds, all_to_all_seconds
from parplan.solver.cost.layout import TensorLayout
from parplan.solver.cost.op_layout import input_layout, loop_dims, output_layout, partial_gradient_axes, renaming
from parplan.solver.cost.resharding import edge_seconds
from parplan.solver.cost.unit_strategy import UnitStrategy, cp_dim, op_mesh, uniform_strategy, unit_layout
from parplan.solver.ir import Graph, Node, OpKind


def tp_comm_seconds(graph: Graph, nodes: Iterable[Node], s: UnitStrategy, link: Link, act: int,
                    cp_link: Link | None = None) -> float:
    """Tensor-parallel collectives of one micro-batch: every tensor entering an operator of
    ``nodes`` (a unit) converted from its producer's layout to the one the operator needs, and the gradient
    it leaves partial reduced (the ILP's edge rules, :func:`~.resharding.edge_seconds`; readers
    of one tensor share it), and vocabulary-parallel cross entropy's statistics. Under context
    parallelism attention reads its keys and values as its exchange brings them (priced apart);
    the expert axis's token exchange is priced apart too (:func:`token_all_to_all_seconds`)."""
    mesh = op_mesh(s)
    sizes, links = mesh.sizes, {"tp": link, "cp": cp_link or link}
    axes = {a for a in sizes if a != "ep"}  # (the token exchange is priced apart)
    seconds = 0.0
    per_tensor: dict[str, float] = {}
    produced_by: dict[str, tuple[Node, TensorLayout]] = {}  # a tensor read by several operators
    for n in nodes:
        if n.kind is OpKind.INPUT or _follows_producer(graph, n):
            continue
        op = uniform_strategy(n, graph, s)
        if n.kind is OpKind.CROSS_ENTROPY and "tp" in unit_layout(graph.node(n.inputs[0]), s).axes:
            # vocabulary-parallel cross entropy: the logits' max, the sum of exponentials and the
            # target logit, per token in fp32, all-reduced over TP
            local = n.numel * 4 / output_layout(n, op, mesh, frozenset()).shards(sizes)
            seconds += 3 * all_reduce_seconds(s.tp, local, link)
        for pos, i in enumerate(n.inputs):
            src = graph.node(i)
            if src.is_parameter or src.kind is OpKind.INPUT:
                continue
            if i not in produced_by:
                produced_by[i] = _produced_layout(graph, src, s)
            origin, produced = produced_by[i]
            needed = input_layout(n, pos, graph, op, mesh)
            partial = partial_gradient_axes(n, pos, graph, op, mesh)
            if s.cp > 1 and n.kind is OpKind.ATTENTION and pos in (1, 2):
                needed, partial = ring_chunk_layout(needed, src), partial - {"cp"}
            cost = edge_seconds(origin.numel * tensor_bytes(origin, act), produced, needed, partial, sizes, links,
                                axes)
            per_tensor[origin.id] = max(per_tensor.get(origin.id, 0.0), cost)
    return seconds + sum(per_tensor.values())


def token_all_to_all_seconds(graph: Graph, nodes: Iterable[Node], s: UnitStrategy, link: Link, act: int) -> float:
    """Expert parallelism's token exchange of one micro-batch (GShard; Megatron-LM's all-to-all
    dispatcher): each rank sends its dispatched buffer (``experts x capacity x hidden``, of its
    own tokens) to the ranks holding the experts, and the experts' outputs come back (combine),
    each once in forward, once more for a recomputed forward, and once in backward; over the
    node's links and, for a group spanning nodes, each GPU's share of the network (the group
    link's ``spread``, :func:`~.collectives.all_to_all_seconds`)."""
    mesh = op_mesh(s)
    sizes = mesh.sizes
    # (op keeps the exchange's outputs: all_to_all_single; Megatron-LM's moe module reruns the MoE layer)
    passes = 3 if s.recompute is Recompute.FULL or "moe" in s.recompute.modules else 2
    seconds = 0.0
    for n in nodes:
        if n.kind is not OpKind.DISPATCH:
            continue
        lay = output_layout(n, uniform_strategy(n, graph, s), mesh, frozenset())
        # one rank's buffer: its own tokens (the expert axis's split is the exchange itself)
        local = n.numel * act / math.prod(sizes[a] for a in lay.axes if a != "ep")
        seconds += 2 * passes * all_to_all_seconds(s.ep, local, link)
    return seconds


def ring_chunk_layout(needed: TensorLayout, kv: Node) -> TensorLayout:
    """The layout in which context-parallel attention reads keys or values ``kv``: as it needs them,
    but split over the context axis like its own share (the rest arrives through its exchange)."""
    tokens = cp_dim(kv.shape)
    split = dict(needed.split)
    if tokens is not None:
        split[tokens] = (*split.get(tokens, ()), "cp")
    return TensorLayout.of(split, needed.partial)


def _follows_producer(graph: Graph, node: Node) -> bool:
    """A view that only renames its producer's dims takes the producer's layout (as in the ILP)."""
    if renaming(graph, node) is None:
        return False
    src = graph.node(node.inputs[0])
    return not src.is_leaf and not loop_dims(src, graph)[1]


def _produced_layout(graph: Graph, node: Node, s: UnitStrategy) -> tuple[Node, TensorLayout]:
    """The operator that made ``node``'s tensor (views followed) and the layout it is in, named as
    ``node`` names its dims."""
    chain = []
    while _follows_producer(graph, node):
        chain.append(node)
        node = graph.node(node.inputs[0])
    lay = output_layout(node, uniform_strategy(node, graph, s), op_mesh(s), loop_dims(node, graph)[1])
    for view in reversed(chain):
        rename = renaming(graph, view) or {}
        lay = TensorLayout(tuple((rename.get(d, d), a) for d, a in lay.split), lay.partial)
    return node, lay

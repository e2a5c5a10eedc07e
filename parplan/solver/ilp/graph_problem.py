"""An ILP problem of a graph on a mesh, and what reading its answer back needs: the variable sets
of the operators (repeated layers share them), their candidates, the edge classes and their
layouts (built by :mod:`.problem`; the step's moments by :mod:`.moments`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from parplan.solver.cost.activations import SCATTERED, UNREDUCED, SavedItem, op_saved_items, saved_items
from parplan.solver.cost.layout import TensorLayout
from parplan.solver.cost.op_layout import renaming
from parplan.solver.cost.resharding import reduced_layout
from parplan.solver.cost.runtime import Runtime
from parplan.solver.ilp.costs import IlpContext, StrategyCost
from parplan.solver.ilp.model import AuxProblem, PeakTerm
from parplan.solver.ilp.strategies import OpStrategy, output_layout
from parplan.solver.ir import Node


@dataclass
class GraphProblem:
    """The auxiliary problem plus what is needed to read its answer back."""

    problem: AuxProblem
    ctx: IlpContext
    ops: list[Node]  # every operator (not inputs or parameters), graph order
    rep_of: dict[str, str]  # operator -> the representative whose variables it uses
    copies: dict[str, dict[str, int]]  # representative -> {operator priced for its copies: how many}
    strategies: dict[str, list[OpStrategy]]  # representative -> candidates
    costs: dict[str, list[StrategyCost]]  # representative -> cost per candidate
    partial_dims: dict[str, frozenset[str]]
    follows: dict[str, str]  # view -> the operator whose layout it takes
    edges: list[tuple[str, str, int]]  # original (producer, consumer, position) among operators
    param_edges: list[tuple[str, int, str, int]]  # (owner, its position, another reader, its position)
    #: edge class (producer's representative, consumer's representative, position) -> index in problem.edges
    edge_index: dict[tuple[str, str, int], int] = field(default_factory=dict)
    #: per edge index: the layout of each producer class and of each consumer class
    edge_layouts: dict[int, tuple[list[TensorLayout], list[TensorLayout]]] = field(default_factory=dict)
    #: per activation edge index: the mesh axes each consumer class leaves its input's gradient partial over
    edge_partials: dict[int, list[frozenset[str]]] = field(default_factory=dict)
    #: per parameter edge index: whether each owner class shards the parameter with ZeRO-3 per operator
    param_edge_sharded: dict[int, list[bool]] = field(default_factory=dict)
    #: parameter edge class (owner's representative, position, reader's representative, position) -> index
    param_edge_index: dict[tuple[str, int, str, int], int] = field(default_factory=dict)
    #: values computed once per problem (layouts, the moments' units), see :mod:`.moments`
    caches: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    #: whether the edges and the moments are in the problem (:func:`complete_problem`)
    complete: bool = False

    #: builds the temporaries of every moment of the step (set with the moments, :func:`.moments.add_moment_terms`)
    temporaries: Callable[[GraphProblem], list[PeakTerm]] | None = field(default=None, repr=False, compare=False)

    @property
    def temporary_terms(self) -> list[PeakTerm]:
        """The temporaries of every moment of the step (reported; see :mod:`.moments`), built on
        first use."""
        assert self.temporaries is not None, "the problem is not complete"
        return self.temporaries(self)

    def strategy_of(self, op: str, choice: Mapping[str, int]) -> OpStrategy:
        rep = self.rep_of[op]
        return self.strategies[rep][choice[rep]]

    def out_layout(self, op: str, choice: Mapping[str, int]) -> TensorLayout:
        """Output layout of ``op`` (a view: its origin's, with the dims renamed)."""
        origin = origin_of(op, self.follows)
        return source_layout(self, op, choice[self.rep_of[origin]])


def consumer_saves(gp: GraphProblem, op: str, position: int) -> float:
    """Bytes (whole tensor) of input ``position`` that operator ``op`` keeps for its backward, 0 if none
    (or when the runtime keeps the producer's copy instead, see ``IlpContext.keeps_resharded_copies``)."""
    ctx = gp.ctx
    if not ctx.keeps_resharded_copies:
        return 0.0
    graph = ctx.graph
    node = graph.node(op)
    key = node.inputs[position]
    fp8 = ctx.precision.te_fp8 and ctx.runtime is Runtime.MEGATRON  # the runtime the items are priced with
    items = (saved_items(graph, [node], ctx.precision.activation_bytes, flash_attention=ctx.flash_attention,
                         recompute=ctx.recompute, fp8_inputs=fp8)
             if ctx.recompute.rebuilds_blocks else
             op_saved_items(node, graph, ctx.precision.activation_bytes, flash_attention=ctx.flash_attention,
                            recompute=ctx.recompute, fp8_inputs=fp8))
    return next((it.total_bytes for it in items if it.key in (key, f"{key}#fp8") and it.dims is None), 0.0)


def partial_saved_bytes(items: Sequence[SavedItem], produced: TensorLayout, needed: TensorLayout,
                        sizes: Mapping[str, int]) -> float:
    """Bytes of a tensor's saved buffers held on each device when the producer leaves it partial:
    as reduced for its first reader (charged on that edge), none otherwise (charged with the
    producer, see :func:`~parplan.solver.ilp.costs.owner_saved_bytes`); a reduce-scatter's output
    (:data:`SCATTERED`) only where the reduction splits the tensor further."""
    if not produced.partial:
        return 0.0
    lay = reduced_layout(produced, needed)
    scatters = lay.shards(sizes) > TensorLayout(produced.split).shards(sizes)
    return sum(it.total_bytes / lay.shards(sizes, it.dims) for it in items
               if it.reduction != UNREDUCED and (it.reduction != SCATTERED or scatters))


def resharded_copy_bytes(kept_bytes: float, produced: TensorLayout, needed: TensorLayout,
                         sizes: Mapping[str, int]) -> float:
    """A consumer that keeps an input for backward keeps the copy it received: when the input
    arrives in another layout than its producer's (reduced) one, that copy is held besides the
    producer's, which the producer is charged for."""
    base = reduced_layout(produced, needed) if produced.partial else produced
    if dict(base.split) == dict(needed.split):
        return 0.0
    return kept_bytes / needed.shards(sizes)


def origin_of(op: str, follows: Mapping[str, str]) -> str:
    while op in follows:
        op = follows[op]
    return op


def source_layout(gp: GraphProblem, src: str, s: int) -> TensorLayout:
    """Layout the tensor of ``src`` has when its origin takes strategy ``s`` (views rename dims)."""
    origin = gp.rep_of[origin_of(src, gp.follows)]
    node = gp.ctx.graph.node(origin)
    lay = output_layout(node, gp.strategies[origin][s], gp.ctx.mesh, gp.partial_dims[origin])
    chain = []
    op = src
    while op in gp.follows:
        chain.append(op)
        op = gp.follows[op]
    for view in reversed(chain):  # rename dims from the origin outwards
        rename = renaming(gp.ctx.graph, gp.ctx.graph.node(view)) or {}
        lay = TensorLayout(tuple((rename.get(d, d), a) for d, a in lay.split), lay.partial)
    return lay

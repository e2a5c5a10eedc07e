"""A uniform (Megatron-LM style) strategy as a choice of the ILP: the same plan in the ILP's terms.

On a mesh with a data axis and a tensor axis (either may be absent), every operator splits its
batch over the data axis and, over the tensor axis, the dim Megatron-LM's layout splits (attention
heads, key/value heads, the MLP's hidden units, the vocabulary; with sequence parallelism the
sequence of the operators TP leaves whole), and the operators owning parameters shard them with the
strategy's ZeRO stage. The ILP prices that choice with the same rules as the whole-plan evaluator
prices the uniform strategy (a property test holds them equal), and the search starts from it.
"""

from __future__ import annotations

from parplan.solver.cost.op_layout import BATCH_DIMS, OpStrategy, uniform_assignment
from parplan.solver.ilp.problem import GraphProblem


def uniform_choice(gp: GraphProblem, data_axis: str | None, tensor_axis: str | None, sequence_parallel: bool,
                   zero: int) -> dict[str, int] | None:
    """The index of the uniform strategy's candidate for every ILP variable set, or None when a
    candidate was pruned or the strategy does not divide the model."""
    graph, mesh = gp.ctx.graph, gp.ctx.mesh
    choice: dict[str, int] = {}
    for rep, cands in gp.strategies.items():
        node = graph.node(rep)
        wanted = uniform_assignment(node, graph, mesh, data_axis, tensor_axis, sequence_parallel)
        owns = bool(gp.ctx.owned_params.get(rep)) and any(d in BATCH_DIMS for d in wanted if d)
        target = OpStrategy(wanted, zero if owns else 0)
        index = next((i for i, s in enumerate(cands) if s == target), None)
        if index is None:
            return None
        choice[rep] = index
    return choice

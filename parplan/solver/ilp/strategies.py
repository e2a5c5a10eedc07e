"""Intra-operator strategies: which mesh axes split which named dims of an operator.

A strategy maps every mesh axis to one of the operator's *loop dims* or to nothing (replicated
along that axis); one dim may take several axes (``S01``). Splitting a dim that the output lacks
(an einsum's contracted dim, an embedding's vocabulary) leaves *partial sums* on that axis. Input
layouts follow from the strategy: an input is split by an axis when it has the axis's dim, and is
replicated along it otherwise. Operators that cannot split a dim (softmax over it, a norm over
it, attention's head dim and key sequence) never assign an axis to it. Splits must divide.

Parameters are priced with the operator that first reads them, including the ZeRO choices data
parallelism offers: over the *data axes* (axes splitting the batch but not the parameter) the
optimizer states (ZeRO-1), gradients (ZeRO-2) and weights (ZeRO-3) may be sharded.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence

from parplan.solver.cost.op_layout import (
    BATCH_DIMS,
    Mesh,
    OpStrategy,
    data_axes,
    input_layout,
    loop_dims,
    output_layout,
    partial_gradient_axes,
    work_shards,
)
from parplan.solver.ir import Graph, Node, OpKind

__all__ = ["BATCH_DIMS", "Mesh", "OpStrategy", "candidate_strategies", "data_axes", "enumerate_assignments",
           "input_layout", "loop_dims", "mesh_shapes", "output_layout", "partial_gradient_axes", "valid_for",
           "work_shards"]


def mesh_shapes(num_devices: int, gpus_per_node: int, max_dims: int = 3) -> list[Mesh]:
    """Candidate meshes: 2-D ``[N/k, k]`` for ``k`` dividing the node (1-D ``[N]`` only when there is
    none: a 2-D mesh assigning both axes to one dim expresses every 1-D split); and, when the
    devices span several nodes, 3-D ``[N/(j·k), j, k]`` with ``j·k`` dividing the node (an
    inter-node axis and two intra-node ones; within one node two axes already express every split
    pattern the search uses). Axes are named ``m0, m1, m2`` outermost first, so the last axis stays
    inside a node."""
    out = [Mesh((("m0", num_devices),))]
    if max_dims >= 2:
        # a 2-D mesh splitting one dim over both axes is the 1-D mesh, with each axis on its own link
        out = []
        for k in range(2, min(gpus_per_node, num_devices) + 1):
            if gpus_per_node % k == 0 and num_devices % k == 0 and num_devices // k > 1:
                out.append(Mesh((("m0", num_devices // k), ("m1", k))))
    if max_dims >= 3 and num_devices > gpus_per_node:
        for j in range(2, gpus_per_node + 1):
            for k in range(2, gpus_per_node // j + 1):
                if gpus_per_node % (j * k) == 0 and num_devices % (j * k) == 0 and num_devices // (j * k) > 1:
                    out.append(Mesh((("m0", num_devices // (j * k)), ("m1", j), ("m2", k))))
    return out or [Mesh((("m0", num_devices),))]


def enumerate_assignments(mesh: Mesh, dims: Mapping[str, int]) -> Iterator[tuple[str | None, ...]]:
    """Every map of mesh axes to dims (or None) whose splits divide the dims."""
    options: list[str | None] = [None, *dims]
    for combo in itertools.product(options, repeat=len(mesh.axes)):
        ok = True
        for d in dims:
            split = math.prod(s for (_, s), c in zip(mesh.axes, combo, strict=True) if c == d)
            if dims[d] % split:
                ok = False
                break
        if ok:
            yield combo


def valid_for(node: Node, graph: Graph, s: OpStrategy, mesh: Mesh, dims: Mapping[str, int]) -> bool:
    """Extra rules: grouped-query attention needs the key heads divisible by the head split."""
    if node.kind is OpKind.ATTENTION:
        k = graph.node(node.inputs[1]).shape
        lay = input_layout(node, 1, graph, s, mesh)
        sizes = mesh.sizes
        for d, axes in lay.split:
            if k[d] % math.prod(sizes[a] for a in axes):
                return False
    return True


def candidate_strategies(node: Node, graph: Graph, mesh: Mesh, owns_params: bool,
                         zero_stages: Sequence[int] = (0, 1, 2, 3)) -> list[OpStrategy]:
    """All strategies of ``node`` on ``mesh`` (with ZeRO variants when it owns parameters and
    splits the batch)."""
    dims, _ = loop_dims(node, graph)
    out: list[OpStrategy] = []
    for combo in enumerate_assignments(mesh, dims):
        base = OpStrategy(combo)
        if not valid_for(node, graph, base, mesh, dims):
            continue
        if owns_params and data_axes(base, mesh):
            out.extend(OpStrategy(combo, z) for z in zero_stages)
        else:
            out.append(base)
    return out

"""A unit's strategy apart from data parallelism, and the per-device layout of its tensors.

Kept apart from :mod:`.units` so that :mod:`.backward` (which :mod:`.units` uses) can size tensors
the same way without a circular import.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.layout import REPLICATED, TensorLayout
from parplan.solver.cost.op_layout import Mesh, OpStrategy, uniform_assignment
from parplan.solver.cost.runtime import Runtime
from parplan.solver.ir import Graph, Node, OpKind
from parplan.solver.strategy import CP_DIMS, SEQ_DIMS, TP_DIMS


@dataclass(frozen=True)
class UnitStrategy:
    """What changes a unit's per-device costs apart from data parallelism: TP degree, sequence
    parallelism, expert-parallel degree, recomputation, flash attention, context-parallel degree."""

    tp: int = 1
    sp: bool = False
    ep: int = 1
    recompute: Recompute = Recompute.SELECTIVE
    flash_attention: bool = True
    runtime: Runtime = Runtime.MEGATRON
    cp: int = 1  # context parallelism: every activation's tokens split over cp ranks
    cp_comm: str = "p2p"  # its attention exchange: "p2p" (ring) or "a2a" (all-to-all, Ulysses)


def cp_dim(dims: Mapping[str, int] | Iterable[str]) -> str | None:
    """The dim of a tensor (or an operator's loop dims) that context parallelism splits, if any."""
    return next((d for d in CP_DIMS if d in dims), None)


def mesh_sizes(s: UnitStrategy) -> dict[str, int]:
    """Axis sizes of :func:`op_mesh` (``cp`` only when context-parallel)."""
    return {"tp": s.tp, "ep": s.ep, "cp": s.cp} if s.cp > 1 else {"tp": s.tp, "ep": s.ep}


def unit_layout(node: Node, s: UnitStrategy) -> TensorLayout:
    """Megatron-LM layout of a tensor: TP splits heads / ffn / vocab, SP splits the sequence of
    the other activations, EP splits the experts of expert weights, CP splits the sequence (or an
    expert's capacity) of every activation and input. Graph built per replica, so nothing is split
    over data axes."""
    dims = node.shape
    split: dict[str, tuple[str, ...]] = {}
    if s.tp > 1:
        tp_dim = next((d for d in TP_DIMS if d in dims), None)
        if tp_dim is not None:
            split[tp_dim] = ("tp",)
        elif s.sp and not node.is_parameter and node.kind is not OpKind.INPUT:  # ids stay whole
            seq_dim = next((d for d in SEQ_DIMS if d in dims), None)
            if seq_dim is not None:
                split[seq_dim] = ("tp",)
    if s.ep > 1 and node.is_parameter and "expert" in dims:
        split["expert"] = ("ep",)
    if s.cp > 1 and not node.is_parameter:
        tokens = cp_dim(dims)
        if tokens is not None:
            split[tokens] = (*split.get(tokens, ()), "cp")
    return TensorLayout.of(split) if split else REPLICATED


def op_mesh(s: UnitStrategy) -> Mesh:
    """The mesh of one data-parallel replica under ``s``: the tensor axis, the expert axis and, when
    context-parallel, the context axis."""
    return Mesh(tuple(mesh_sizes(s).items()))


def uniform_strategy(node: Node, graph: Graph, s: UnitStrategy) -> OpStrategy:
    """``node``'s split under ``s`` as an operator strategy on :func:`op_mesh` (the graph is one
    replica's: the batch is not split here)."""
    return OpStrategy(uniform_assignment(node, graph, op_mesh(s), None, "tp" if s.tp > 1 else None, s.sp,
                                         "ep" if s.ep > 1 else None, "cp" if s.cp > 1 else None))


def local_elems(node: Node, s: UnitStrategy) -> float:
    """Elements of ``node``'s tensor on one device, in its :func:`unit_layout`."""
    return node.numel / unit_layout(node, s).shards(mesh_sizes(s))


def weight_grad_workspace(n: Node, w: Node, s: UnitStrategy) -> float:
    """Gradient elements the backward of ``n`` makes for its weight ``w`` on one device. PyTorch's
    vocabulary-parallel embedding first makes the whole table's gradient, then copies its own rows
    out of it."""
    local = local_elems(w, s)
    if n.kind is OpKind.EMBEDDING and s.runtime.full_embedding_gradient:
        return w.numel + (local if local < w.numel else 0.0)
    return local

"""A unit's strategy apart from data parallelism, and the per-device layout of its tensors.

Kept apart from :mod:`.units` so that :mod:`.backward` (which :mod:`.units` uses) can size tensors
the same way without a circular import.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.layout import REPLICATED, TensorLayout
from parplan.solver.cost.op_layout import Mesh, OpStrategy, uniform_assignment
from parplan.solver.cost.runtime import Runtime
from parplan.solver.ir import Dims, Graph, Node, OpKind
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
    etp: int = 0  # the experts' own tensor-parallel degree (Megatron-LM's --expert-tensor-parallel-size); 0: tp


def cp_dim(dims: Mapping[str, int] | Iterable[str]) -> str | None:
    """The dim of a tensor (or an operator's loop dims) that context parallelism splits, if any."""
    return next((d for d in CP_DIMS if d in dims), None)


def mesh_sizes(s: UnitStrategy) -> dict[str, int]:
    """Sizes of the axes :func:`unit_layout` splits over: :func:`op_mesh`'s, and under an expert
    tensor-parallel degree of its own the TP group's two factors for the experts (``etp`` and ``etx``,
    ``tp / etp``: :func:`_expert_layout`)."""
    return _mesh_sizes(s.tp, s.ep, s.cp, s.etp)


def _mesh_sizes(tp: int, ep: int, cp: int, etp: int = 0) -> dict[str, int]:
    sizes = {"tp": tp, "ep": ep, "cp": cp} if cp > 1 else {"tp": tp, "ep": ep}
    return {**sizes, "etp": etp, "etx": tp // etp} if etp else sizes


def unit_layout(node: Node, s: UnitStrategy) -> TensorLayout:
    """Megatron-LM layout of a tensor: TP splits heads / ffn / vocab, SP splits the sequence of
    the other activations, EP splits the experts of expert weights, CP splits the sequence (or an
    expert's capacity) of every activation and input. Graph built per replica, so nothing is split
    over data axes."""
    return _layout(node.kind, node.dims, s.tp, s.sp, s.ep, s.cp, s.etp)


def _expert_layout(names: list[str], parameter: bool, cp: int, etp: int) -> TensorLayout:
    """A routed expert's tensor under an expert tensor-parallel degree ``etp`` other than ``tp``
    (megatron/core/transformer/moe): its weights' hidden units split over the ``etp`` ranks of the
    expert tensor-parallel group (``etp`` axis), the experts over ``ep`` (also at ``ep = 1``: the
    axis marks the expert data-parallel group); its tokens those the all-to-all dispatcher gives a rank:
    its own sequence-parallel share exchanged over the expert group, then all-gathered over the expert
    tensor-parallel group (``token_dispatcher.py``, ``MoEAlltoAllTokenDispatcher``), so ``etp / tp`` of
    the TP group's (the capacity split over ``etx = tp / etp``), their hidden units over ``etp``."""
    split: dict[str, tuple[str, ...]] = {"ffn": ("etp",)} if "ffn" in names and etp > 1 else {}
    if parameter:
        split["expert"] = ("ep",)
    elif "capacity" in names:
        split["capacity"] = ("etx", "cp") if cp > 1 else ("etx",)
    return TensorLayout.of(split)


@functools.lru_cache(maxsize=65536)
def _layout(kind: OpKind, dims: Dims, tp: int, sp: bool, ep: int, cp: int, etp: int = 0) -> TensorLayout:
    """:func:`unit_layout` of a node of this kind and these dims under these degrees (all it depends
    on), memoised: the searches ask for the same few hundred layouts millions of times. A routed
    expert's tensors lead with the ``expert`` dim (the builder's ``_moe``; the router's end with it)."""
    names = [d for d, _ in dims]
    parameter = kind is OpKind.PARAMETER
    if etp and len(names) > 1 and names[0] == "expert":
        return _expert_layout(names, parameter, cp, etp)
    split: dict[str, tuple[str, ...]] = {}
    if tp > 1:
        tp_dim = next((d for d in TP_DIMS if d in names), None)
        if tp_dim is not None:
            split[tp_dim] = ("tp",)
        elif sp and not parameter and kind is not OpKind.INPUT:  # ids stay whole
            seq_dim = next((d for d in SEQ_DIMS if d in names), None)
            if seq_dim is not None:
                split[seq_dim] = ("tp",)
    if ep > 1 and parameter and "expert" in names:
        split["expert"] = ("ep",)
    if cp > 1 and not parameter:
        tokens = cp_dim(names)
        if tokens is not None:
            split[tokens] = (*split.get(tokens, ()), "cp")
    return TensorLayout.of(split) if split else REPLICATED


def op_mesh(s: UnitStrategy) -> Mesh:
    """The mesh of one data-parallel replica under ``s``: the tensor axis, the expert axis and, when
    context-parallel, the context axis (the operators keep the experts on the tensor axis: an expert
    tensor-parallel degree of its own sizes their tensors, :func:`unit_layout`, not their work)."""
    return Mesh(tuple(_mesh_sizes(s.tp, s.ep, s.cp).items()))


def uniform_strategy(node: Node, graph: Graph, s: UnitStrategy) -> OpStrategy:
    """``node``'s split under ``s`` as an operator strategy on :func:`op_mesh` (the graph is one
    replica's: the batch is not split here)."""
    return OpStrategy(uniform_assignment(node, graph, op_mesh(s), None, "tp" if s.tp > 1 else None, s.sp,
                                         "ep" if s.ep > 1 else None, "cp" if s.cp > 1 else None))


def local_elems(node: Node, s: UnitStrategy) -> float:
    """Elements of ``node``'s tensor on one device, in its :func:`unit_layout`."""
    return _local_elems(node.kind, node.dims, s.tp, s.sp, s.ep, s.cp, s.etp)


@functools.lru_cache(maxsize=65536)
def _local_elems(kind: OpKind, dims: Dims, tp: int, sp: bool, ep: int, cp: int, etp: int = 0) -> float:
    lay = _layout(kind, dims, tp, sp, ep, cp, etp)
    return math.prod(size for _, size in dims) / lay.shards(_mesh_sizes(tp, ep, cp, etp))


def weight_grad_workspace(n: Node, w: Node, s: UnitStrategy) -> float:
    """Gradient elements the backward of ``n`` makes for its weight ``w`` on one device. PyTorch's
    vocabulary-parallel embedding first makes the whole table's gradient, then copies its own rows
    out of it."""
    local = local_elems(w, s)
    if n.kind is OpKind.EMBEDDING and s.runtime.full_embedding_gradient:
        return w.numel + (local if local < w.numel else 0.0)
    return local

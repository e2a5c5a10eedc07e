"""Memory and time of one operator under one strategy, and of one resharding edge.

Memory (bytes per device, the redundant-memory cost model):

- parameters the operator owns (it is their first reader): weights, gradients and optimizer
  states at the layout the strategy gives them, ZeRO-sharded over the strategy's data axes;
- activations saved for backward whose owner is this operator's output, at its output layout
  (partial sums count as reduced, i.e. replicated); buffers owned by graph inputs (token ids) are
  charged to the operator that saves them, at its input layout.

Time (seconds per training step of ``m`` micro-batches):

- forward + backward (+ recomputed forward) roofline time: the FLOPs divided over the devices the
  work is split over, the memory traffic of the pieces one device holds (an activation input's
  gradient that comes out partial is reduced on its edge, see :mod:`.resharding`);
- parameter gradients are partial along axes that split the work but not the parameter: once per
  step, the operator's parameters together (one bucket), an all-reduce (ZeRO 0) or a
  reduce-scatter (ZeRO 1-3), hidden behind the operator's backward of one micro-batch (its
  recomputed forward included) as far as that lasts; ZeRO-3 also all-gathers the weights in every
  micro-batch's forward and backward, each hidden behind that pass (the backward's shares its time
  with the reduction) (:func:`~parplan.solver.cost.rules.exposed_seconds`, as the evaluator); ZeRO
  1-2 all-gather the updated weights after the optimizer step, exposed, or under the next forward
  where the runtime gathers before it (:func:`~parplan.solver.cost.rules.weight_gather_exposed_seconds`);
  the compute that hides traffic runs without the SMs the collective holds
  (:func:`~parplan.solver.cost.kernels.collective_sm_share`);
- the optimizer step: reading gradients and optimizer states, writing weights and states;
- vocabulary-parallel cross entropy all-reduces three per-token statistics; expert-parallel
  dispatch and combine each do an all-to-all forward and backward.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from parplan.solver.calibration import Calibration
from parplan.solver.cluster import GpuSpec, Link, MeshLinks
from parplan.solver.cost.activations import SCATTERED, UNREDUCED, Recompute, SavedItem, block_of
from parplan.solver.cost.collectives import (
    all_reduce_seconds,
    all_to_all_seconds,
    data_parallel_seconds,
)
from parplan.solver.cost.kernels import collective_sm_share
from parplan.solver.cost.layout import TensorLayout
from parplan.solver.cost.memory import MemoryBreakdown
from parplan.solver.cost.precision import Precision
from parplan.solver.cost.rules import (
    data_parallel_collectives,
    exposed_seconds,
    op_seconds,
    optimizer_step_seconds,
    parameter_states,
    recomputed,
    unit_parameter_numel,
    weight_gather_exposed_seconds,
)
from parplan.solver.cost.runtime import Runtime
from parplan.solver.cost.units import _freeze
from parplan.solver.ilp.strategies import Mesh, OpStrategy, data_axes, input_layout, loop_dims, output_layout
from parplan.solver.ir import Graph, Node, OpKind


@dataclass(frozen=True)
class IlpContext:
    """Everything an operator's cost depends on besides its strategy."""

    graph: Graph
    mesh: Mesh
    links: MeshLinks  # per mesh axis, and per group of axes
    gpu: GpuSpec
    calibration: Calibration
    precision: Precision
    microbatches: int
    recompute: Recompute
    flash_attention: bool
    owned_params: Mapping[str, Sequence[int]]  # op id -> input positions of the parameters it owns
    saved_by_owner: Mapping[str, Sequence[SavedItem]]  # op id -> buffers saved at its output
    saved_at_input: Mapping[str, Sequence[tuple[int, SavedItem]]]  # op id -> (position, item) of input-owned
    runtime: Runtime = Runtime.MEGATRON
    #: ZeRO-3 weights gathered for each operator alone, forward and backward, and their gradients
    #: reduce-scattered at once (the agent's per-operator executor); else per block, as FSDP does
    zero3_per_operator: bool = False
    #: prices remembered for the problem (:func:`op_cost`'s parts alike operators share)
    memo: dict[Any, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)

    @property
    def keeps_resharded_copies(self) -> bool:
        """Whether a consumer that receives an input in another layout keeps that copy for its
        backward (PyTorch's DTensor); Megatron-LM keeps the producer's (a sequence-parallel input
        sharded) and converts it again in backward."""
        return self.runtime.saves_gathered_sp_inputs

    def group_link(self, axes: Sequence[str]) -> Link:
        """The link a ring over the group spanning ``axes`` sees (:meth:`MeshLinks.group`)."""
        return self.links.group(axes)

    def group_size(self, axes: Sequence[str]) -> int:
        sizes = self.mesh.sizes
        return math.prod(sizes[a] for a in axes)


@dataclass(frozen=True)
class StrategyCost:
    memory: MemoryBreakdown
    redundant: MemoryBreakdown
    seconds: float

    @property
    def memory_bytes(self) -> float:
        return self.memory.total

    def __add__(self, other: StrategyCost) -> StrategyCost:
        return StrategyCost(self.memory + other.memory, self.redundant + other.redundant, self.seconds + other.seconds)

    def times(self, copies: int) -> StrategyCost:
        """The cost of ``copies`` operators alike."""
        return StrategyCost(self.memory.scaled(copies), self.redundant.scaled(copies), self.seconds * copies)


def _local(nbytes: float, layout: TensorLayout, mesh: Mesh, dims: frozenset[str] | None = None) -> float:
    return nbytes / layout.shards(mesh.sizes, dims)


def owner_saved_bytes(it: SavedItem, produced: TensorLayout, sizes: Mapping[str, int]) -> float:
    """Bytes of a saved buffer of an operator's output held on each device, charged with the
    producer: in its output layout; a partial output's as its first reader receives it instead
    (:func:`~parplan.solver.ilp.graph_problem.partial_saved_bytes`), except the partial sums
    themselves (:data:`UNREDUCED`)."""
    if it.reduction == SCATTERED or (produced.partial and it.reduction != UNREDUCED):
        return 0.0
    return it.total_bytes / TensorLayout(produced.split).shards(sizes, it.dims)


def op_cost(node: Node, s: OpStrategy, ctx: IlpContext, partial_dims: frozenset[str]) -> StrategyCost:
    """Per-device memory and per-step seconds of ``node`` under ``s``.

    Everything but the saved activations depends only on what the operator is (:func:`signature`)
    and ``s``: it is priced once for all operators alike (the same operator of every block, of
    every block's price class) and remembered on ``ctx``."""
    key = (signature(node, ctx), s)
    work = ctx.memo.get(key)
    if work is None:
        work = ctx.memo[key] = _work_cost(node, s, ctx)
    # the saved activations: the same for operators alike that save alike buffers
    saved = (tuple((it.total_bytes, it.dims, it.reduction) for it in ctx.saved_by_owner.get(node.id, ())),
             tuple((pos, it.total_bytes, it.dims) for pos, it in ctx.saved_at_input.get(node.id, ())))
    skey = ("saved", key, partial_dims, saved)
    held_redundant = ctx.memo.get(skey)
    if held_redundant is None:
        held_redundant = ctx.memo[skey] = _saved_cost(node, s, ctx, partial_dims)
    held, redundant = held_redundant
    return StrategyCost(work.memory + held, work.redundant + redundant, work.seconds)


def signature(node: Node, ctx: IlpContext) -> tuple[object, ...]:
    """What :func:`_work_cost` depends on besides the strategy: the operator's kind, shape, dtype
    and attributes, its inputs' kinds and shapes, the parameters it owns, whether it is in a block
    (full recomputation runs the blocks' forward again) and whether its forward runs again (per-operator
    recomputation: the gate and up projections alike but one kept), its share of its unit's parameters."""
    cache = ctx.memo.setdefault("signature", {})
    sig = cache.get(node.id)
    if sig is None:
        g = ctx.graph
        ins = tuple((i.kind, i.dims, i.dtype) for i in map(g.node, node.inputs))
        sig = cache[node.id] = (node.kind, node.dims, node.dtype, _freeze(node.attrs), ins,
                                tuple(ctx.owned_params.get(node.id, ())), block_of(node) is None,
                                recomputed(node, ctx.recompute, ctx.flash_attention, ctx.runtime, g),
                                _unit_share(node, ctx))
    return sig  # type: ignore[no-any-return]


def _work_cost(node: Node, s: OpStrategy, ctx: IlpContext) -> StrategyCost:
    """Compute, the parameters the operator owns (their states, synchronisation and update), and
    the operator's own collectives."""
    g, mesh, prec = ctx.graph, ctx.mesh, ctx.precision
    sizes = mesh.sizes
    m = ctx.microbatches
    held = {"parameters": 0.0, "gradients": 0.0, "optimizer_states": 0.0, "activations": 0.0}
    redundant = dict(held)
    seconds = 0.0
    worked = {a for a, d in zip(mesh.names, s.assignment, strict=True) if d is not None}
    data = set(data_axes(s, mesh))

    # --- compute
    fwd, bwd, rec = op_seconds(node, g, ctx.gpu, ctx.calibration, prec, s, mesh, ctx.recompute, ctx.flash_attention,
                               ctx.runtime)
    seconds += m * (fwd + bwd + rec)
    sync = 0.0  # once-per-step gradient reduction, under the last micro-batch's backward
    gathers = 0.0  # ZeRO-3 weight gathers of one micro-batch, under its forward and backward
    weight_gather = 0.0  # ZeRO 1-2's once-per-step gather of the updated weights, after the optimizer step
    under_forward = False  # ... or under the next forward, where the runtime gathers before it (FSDP)

    # --- parameters it owns
    # (data axes, other axes) -> each parameter's local elements, synchronised together
    buckets: dict[tuple[tuple[str, ...], tuple[str, ...]], list[float]] = {}
    for pos in ctx.owned_params.get(node.id, ()):
        p = g.node(node.inputs[pos])
        lay = input_layout(node, pos, g, s, mesh)
        local = p.numel / lay.shards(sizes)
        replicated = [a for a in mesh.names if a not in lay.axes and sizes[a] > 1]
        zero_axes = [a for a in replicated if a in data]
        states, states_red = parameter_states(local, prec, s.zero, ctx.group_size(zero_axes),
                                              ctx.group_size(replicated))
        for cat in ("parameters", "gradients", "optimizer_states"):
            held[cat] += getattr(states, cat)
            redundant[cat] += getattr(states_red, cat)
        partial = [a for a in replicated if a in worked]
        if partial:  # the operator's parameters synchronise together, one collective per group of axes
            dp_axes = tuple(a for a in partial if a in data)
            other = tuple(a for a in partial if a not in data)
            buckets.setdefault((dp_axes, other), []).append(local)
    for (dp_axes, other), tensors in buckets.items():
        local = sum(tensors)
        grads, weights = local * prec.grad_bytes, local * prec.weight_transfer_bytes
        if other:
            sync += all_reduce_seconds(ctx.group_size(other), grads, ctx.group_link(other))
        if dp_axes:
            dp = ctx.group_size(dp_axes)
            share = 1.0 if ctx.zero3_per_operator else _unit_share(node, ctx)
            tp = ctx.group_size(mesh.names) // dp
            count = data_parallel_collectives(ctx.runtime, tp, dp, s.zero, tensors, prec.grad_bytes, share)
            # no FSDP2 copies (rules.sharded_copy_seconds): the ILP's plans run under the agent's plan
            # interpreter, whose data-parallel gathers are DTensor's, per operator, or Megatron-LM's
            traffic = data_parallel_seconds(dp, grads, weights, s.zero, ctx.group_link(dp_axes), count)
            sync += traffic.reduce
            weight_gather += traffic.weight_gather
            gathers += traffic.gathers
            under_forward = ctx.runtime.data_parallel(tp, dp, s.zero).gathers
    # Overlap, as the uniform model and DDP/FSDP do: gradient traffic runs during backward (with its
    # recomputed forward), ZeRO-3's gathers are prefetched during compute; only what exceeds that
    # compute is exposed. ZeRO 1-2's weight gather follows the optimizer step.
    slowdown = collective_sm_share(ctx.gpu)
    seconds += exposed_seconds(sync, gathers, fwd, bwd + rec, m, slowdown=slowdown)
    seconds += weight_gather_exposed_seconds(weight_gather, fwd, under_forward, slowdown=slowdown)
    seconds += optimizer_step_seconds(MemoryBreakdown(**held), ctx.gpu, ctx.calibration)

    # --- operator-specific collectives
    if node.kind in (OpKind.CROSS_ENTROPY, OpKind.DISPATCH, OpKind.COMBINE):
        seconds += _own_collectives(node, s, ctx)
    return StrategyCost(MemoryBreakdown(**held), MemoryBreakdown(**redundant), seconds)


def _unit_share(node: Node, ctx: IlpContext) -> float:
    """The share of its unit's parameter elements the operator owns: its part of the unit's one
    collective per pass, where the runtime sends one per unit (:func:`data_parallel_collectives`)."""
    totals = ctx.memo.get("unit_parameter_numel")
    if totals is None:
        totals = ctx.memo["unit_parameter_numel"] = unit_parameter_numel(ctx.graph)
    total = totals.get(node.layer or "", 0.0)
    own = sum(ctx.graph.node(node.inputs[pos]).numel for pos in ctx.owned_params.get(node.id, ()))
    return own / total if total else 0.0


def _own_collectives(node: Node, s: OpStrategy, ctx: IlpContext) -> float:
    """Seconds per step of the collectives the operator itself runs: vocabulary-parallel cross
    entropy's statistics, expert parallelism's all-to-alls."""
    g, mesh = ctx.graph, ctx.mesh
    sizes = mesh.sizes
    m = ctx.microbatches
    out_layout = output_layout(node, s, mesh, loop_dims(node, g)[1])
    seconds = 0.0
    if node.kind is OpKind.CROSS_ENTROPY:
        cdim = str(node.attrs.get("class_dim", "vocab"))
        axes = list(s.axes_of(mesh, cdim))
        if axes:
            stats = node.numel * 4 / out_layout.shards(sizes)
            seconds += m * 3 * all_reduce_seconds(ctx.group_size(axes), stats, ctx.group_link(axes))
    if node.kind in (OpKind.DISPATCH, OpKind.COMBINE):
        axes = list(s.axes_of(mesh, "expert"))
        if axes:
            moved = (node.numel if node.kind is OpKind.DISPATCH else g.node(node.inputs[0]).numel) \
                * ctx.precision.activation_bytes
            local = moved / out_layout.shards(sizes) if node.kind is OpKind.DISPATCH else moved / math.prod(
                sizes[a] for a in axes)
            seconds += m * 2 * all_to_all_seconds(ctx.group_size(axes), local, ctx.group_link(axes))
    return seconds


def _saved_cost(node: Node, s: OpStrategy, ctx: IlpContext,
                partial_dims: frozenset[str]) -> tuple[MemoryBreakdown, MemoryBreakdown]:
    """(held, redundant) bytes of the activations ``node`` is charged for saving."""
    g, mesh = ctx.graph, ctx.mesh
    sizes = mesh.sizes
    held = 0.0
    redundant = 0.0
    out_layout = output_layout(node, s, mesh, partial_dims)
    saved_layout = TensorLayout(out_layout.split)
    act_replicas = math.prod(sizes[a] for a in mesh.names if a not in saved_layout.axes)
    for it in ctx.saved_by_owner.get(node.id, ()):
        # (partial sums are saved as their first reader receives them: on that edge, see problem.py)
        local = owner_saved_bytes(it, out_layout, sizes)
        held += local
        redundant += local * (1 - 1 / act_replicas)
    for pos, it in ctx.saved_at_input.get(node.id, ()):
        lay = input_layout(node, pos, g, s, mesh)
        local = _local(it.total_bytes, lay, mesh, it.dims)
        held += local
        redundant += local * (1 - 1 / math.prod(sizes[a] for a in mesh.names if a not in lay.axes))
    return MemoryBreakdown(activations=held), MemoryBreakdown(activations=redundant)

"""Per-stage memory of a uniform strategy, and its most loaded device.

Each pipeline stage's devices hold: the model states of the parameters its nodes use (a tied
embedding used on the first and last stage is resident on both), the saved activations of one
micro-batch times the stage's in-flight count, and a temporary peak: the largest of

- the activations of one block while it is recomputed in backward (full recomputation),
- ZeRO-3's gathered parameters of one block, twice (the current and the prefetched one), plus
  that block's unsharded gradient before its reduce-scatter,
- the gradient of the logits (the last stage),
- a sequence-parallel all-gather of one block's input.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from parplan.solver.cost.activations import Recompute, SavedItem, block_of, saved_items
from parplan.solver.cost.layout import TensorLayout
from parplan.solver.cost.memory import Memory, MemoryContext, activation_memory, model_state_memory
from parplan.solver.cost.pipeline import in_flight_microbatches, node_stages, stage_of_units
from parplan.solver.cost.precision import get_precision
from parplan.solver.ir import Graph, Node, OpKind
from parplan.solver.strategy import ParallelConfig, check_divisibility, megatron_layout


@dataclass(frozen=True)
class StageMemory:
    """One pipeline stage: per-device bytes, activations of one micro-batch, in-flight count."""

    stage: int
    units: tuple[str, ...]
    memory: Memory
    activation_bytes_per_microbatch: float
    in_flight_microbatches: float

    @property
    def peak_bytes(self) -> float:
        return self.memory.bytes.total


@dataclass(frozen=True)
class PlanMemory:
    stages: tuple[StageMemory, ...]

    @property
    def peak_stage(self) -> StageMemory:
        """The most loaded stage (the first when several tie)."""
        return max(self.stages, key=lambda s: (s.peak_bytes, -s.stage))

    @property
    def peak_bytes(self) -> float:
        return self.peak_stage.peak_bytes


def memory_context(cfg: ParallelConfig) -> MemoryContext:
    """Context of one pipeline stage: its devices are the mesh without the ``pp`` axis."""
    stage_mesh = {a: s for a, s in cfg.mesh().items() if a != "pp"}
    return MemoryContext(mesh=stage_mesh, precision=get_precision(cfg.precision), zero_stage=cfg.zero,
                         data_axes=cfg.data_axes, recompute=cfg.recompute, flash_attention=cfg.flash_attention,
                         per_replica_graph=True)


def plan_memory(graph: Graph, cfg: ParallelConfig) -> PlanMemory:
    """Memory of every stage of ``graph`` (built for one micro-batch) under ``cfg``."""
    check_divisibility(graph, cfg)
    ctx = memory_context(cfg)
    layouts = {n.id: megatron_layout(n, cfg) for n in graph.nodes}
    unit_stage = stage_of_units(graph, cfg.pp, cfg.partition)
    stage_of = node_stages(graph, unit_stage)
    by_stage: list[list[Node]] = [[] for _ in range(cfg.pp)]
    for n in graph.nodes:
        if not n.is_parameter:
            by_stage[stage_of[n.id]].append(n)
    stages = []
    for s, nodes in enumerate(by_stage):
        stages.append(_stage_memory(graph, s, nodes, layouts, ctx, cfg,
                                    tuple(u for u, st in unit_stage.items() if st == s)))
    return PlanMemory(tuple(stages))


def _stage_memory(graph: Graph, stage: int, nodes: list[Node], layouts: dict[str, TensorLayout],
                  ctx: MemoryContext, cfg: ParallelConfig, units: tuple[str, ...]) -> StageMemory:
    def layout_of_node(n: Node) -> TensorLayout:
        return layouts[n.id]

    def layout_of_id(nid: str) -> TensorLayout:
        return layouts[nid]

    params = [graph.node(i) for n in nodes for i in n.inputs if graph.node(i).is_parameter]
    states = model_state_memory(params, layout_of_node, ctx)
    act_bytes = ctx.precision.activation_bytes
    items = list(saved_items(graph, nodes, act_bytes, flash_attention=ctx.flash_attention, recompute=ctx.recompute))
    per_mb, per_mb_redundant = activation_memory(items, layout_of_id, ctx)
    flight = in_flight_microbatches(stage, cfg.pp, cfg.num_microbatches, cfg.schedule, cfg.virtual_stages)
    temp = _temporary_bytes(graph, nodes, layouts, ctx, cfg, layout_of_node, layout_of_id)
    held = states.bytes.replace(activations=per_mb * flight, temporary=temp)
    redundant = states.redundant.replace(activations=per_mb_redundant * flight)
    return StageMemory(stage, units, Memory(held, redundant), per_mb, flight)


def _temporary_bytes(graph: Graph, nodes: list[Node], layouts: dict[str, TensorLayout], ctx: MemoryContext,
                     cfg: ParallelConfig, layout_of_node: Callable[[Node], TensorLayout],
                     layout_of_id: Callable[[str], TensorLayout]) -> float:
    act_bytes = ctx.precision.activation_bytes
    blocks: dict[str, list[Node]] = {}
    for n in nodes:
        b = block_of(n)
        if b is not None:
            blocks.setdefault(b, []).append(n)
    candidates = [0.0]
    if ctx.recompute is Recompute.FULL:
        for members in blocks.values():
            inner: list[SavedItem] = list(saved_items(graph, members, act_bytes, flash_attention=ctx.flash_attention,
                                                      recompute=Recompute.SELECTIVE))
            candidates.append(activation_memory(inner, layout_of_id, ctx)[0])
    if ctx.zero_stage >= 3:
        unsharded = MemoryContext(ctx.mesh, ctx.precision, 0, (), ctx.recompute, ctx.flash_attention)
        for members in blocks.values():
            params = [graph.node(i) for n in members for i in n.inputs if graph.node(i).is_parameter]
            m = model_state_memory(params, layout_of_node, unsharded).bytes
            candidates.append(2 * m.parameters + m.gradients)
    for n in nodes:
        if n.kind is OpKind.CROSS_ENTROPY:
            logits = graph.node(n.inputs[0])
            candidates.append(logits.numel * act_bytes / layouts[logits.id].shards(ctx.mesh))
    if cfg.sequence_parallel:
        for n in nodes:
            if n.kind in (OpKind.LAYERNORM, OpKind.RMSNORM) and block_of(n) is not None:
                candidates.append(n.numel * act_bytes)  # the gathered (full-sequence) block input
    return max(candidates)

"""Step time of a uniform strategy: compute, communication, pipeline bubble, optimizer step.

Per micro-batch and stage: every operator's roofline time (forward, backward = 2x forward, plus a
recomputed forward under recomputation) divided by the devices its work is split over, plus the
tensor-parallel collectives the layouts imply:

- a *row-parallel* einsum (its contracted dim split over ``tp``) leaves partial sums: an
  all-reduce of its output (a reduce-scatter with sequence parallelism) in forward, and with
  sequence parallelism an all-gather of the output gradient in backward;
- a *column-parallel* einsum (weight split on an output dim, input whole) needs its input
  all-gathered in forward with sequence parallelism, and its input gradient all-reduced
  (reduce-scattered) in backward; einsums reading the same input share that collective;
- between stages, one point-to-point send of the boundary activation per micro-batch each way.

A step is ``m·t_max + (Σ_s t_s − t_max)/v`` (1F1B/GPipe with ``v = 1``: the last micro-batch leaves
the pipeline ``Σ_s t_s − t_max`` after the slowest stage finishes its ``m``; interleaving with ``v``
chunks divides that bubble by ``v``), plus per stage the gradient synchronisation not hidden behind
the last micro-batch's backward, plus the optimizer step (memory bound: it reads and writes the
weights, gradients and optimizer states once).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from parplan.solver.calibration import DEFAULT_CALIBRATION, Calibration, apply
from parplan.solver.cluster import Cluster, DeviceMesh
from parplan.solver.cost.activations import Recompute, block_of
from parplan.solver.cost.collectives import (
    all_gather_seconds,
    all_reduce_seconds,
    p2p_seconds,
    reduce_scatter_seconds,
)
from parplan.solver.cost.compute import backward_seconds, forward_seconds
from parplan.solver.cost.layout import TensorLayout
from parplan.solver.cost.memory import MemoryContext, model_state_memory
from parplan.solver.cost.pipeline import node_stages, stage_of_units
from parplan.solver.cost.plan_memory import memory_context
from parplan.solver.cost.precision import Precision
from parplan.solver.errors import StrategyError
from parplan.solver.ir import Graph, Node, OpKind
from parplan.solver.strategy import ParallelConfig, Schedule, megatron_layout

_FLOATS = frozenset({"bf16", "fp16", "fp32", "tf32"})


@dataclass(frozen=True)
class StageTime:
    """Seconds one micro-batch spends on a stage, and the stage's once-per-step costs."""

    stage: int
    forward_seconds: float
    backward_seconds: float
    recompute_seconds: float
    tp_comm_seconds: float
    p2p_seconds: float
    dp_comm_seconds: float
    dp_exposed_seconds: float
    optimizer_seconds: float

    @property
    def microbatch_seconds(self) -> float:
        return (self.forward_seconds + self.backward_seconds + self.recompute_seconds + self.tp_comm_seconds
                + self.p2p_seconds)


@dataclass(frozen=True)
class PlanTime:
    stages: tuple[StageTime, ...]
    step_seconds: float
    tokens_per_step: int
    num_microbatches: int

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_per_step / self.step_seconds if self.step_seconds > 0 else 0.0

    @property
    def bubble_fraction(self) -> float:
        busy = max(s.microbatch_seconds for s in self.stages)
        return 0.0 if self.step_seconds <= 0 else max(0.0, 1 - busy * self.num_microbatches / self.step_seconds)


def plan_time(graph: Graph, cfg: ParallelConfig, cluster: Cluster,
              calibration: Calibration = DEFAULT_CALIBRATION) -> PlanTime:
    """Predicted step time of ``graph`` (built for one micro-batch) under ``cfg`` on ``cluster``."""
    if cfg.world != cluster.num_devices:
        raise StrategyError(f"tp*pp*dp = {cfg.world} but the cluster has {cluster.num_devices} devices")
    cl = apply(cluster, calibration)
    mesh = DeviceMesh.of(cl, cfg.mesh())
    ctx = memory_context(cfg)
    layouts = {n.id: megatron_layout(n, cfg) for n in graph.nodes}
    unit_stage = stage_of_units(graph, cfg.pp, cfg.partition)
    stage_of = node_stages(graph, unit_stage)
    by_stage: list[list[Node]] = [[] for _ in range(cfg.pp)]
    for n in graph.nodes:
        if not n.is_parameter:
            by_stage[stage_of[n.id]].append(n)
    stages = tuple(_stage_time(graph, s, nodes, layouts, ctx, cfg, cl, mesh, calibration, stage_of)
                   for s, nodes in enumerate(by_stage))
    m, v = cfg.num_microbatches, cfg.virtual_stages if cfg.schedule is Schedule.INTERLEAVED else 1
    per_mb = [s.microbatch_seconds for s in stages]
    t_max = max(per_mb)
    pipeline = m * t_max + (sum(per_mb) - t_max) / v
    tail = max(s.dp_exposed_seconds + s.optimizer_seconds for s in stages)
    seq = int(graph.meta.get("seq_len", 0) or 0)
    tokens = cfg.global_batch * seq
    return PlanTime(stages, pipeline + tail, tokens, m)


def _compute_dtype(node: Node, prec: Precision) -> str:
    return prec.compute_dtype if node.dtype in _FLOATS else node.dtype


def _work_shards(node: Node, graph: Graph, layouts: Mapping[str, TensorLayout], mesh: Mapping[str, int]) -> int:
    """Devices an operator's work is divided over: the most split of its output and inputs."""
    best = layouts[node.id].shards(mesh)
    for i in node.inputs:
        best = max(best, layouts[i].shards(mesh))
    return best


def _stage_time(graph: Graph, stage: int, nodes: list[Node], layouts: Mapping[str, TensorLayout],
                ctx: MemoryContext, cfg: ParallelConfig, cluster: Cluster, mesh: DeviceMesh,
                calibration: Calibration, stage_of: Mapping[str, int]) -> StageTime:
    sizes = dict(mesh.axes)
    prec = ctx.precision
    act = prec.activation_bytes
    fwd = bwd = rec = 0.0
    for n in nodes:
        if n.kind in (OpKind.INPUT, OpKind.PARAMETER):
            continue
        k = _work_shards(n, graph, layouts, sizes)
        dt = _compute_dtype(n, prec)
        f = forward_seconds(n, graph, cluster.gpu, calibration, act, dt) / k
        fwd += f
        bwd += backward_seconds(n, graph, cluster.gpu, calibration, act, dt) / k
        recomputed = (cfg.recompute is Recompute.FULL and block_of(n) is not None) or (
            cfg.recompute is Recompute.SELECTIVE and not cfg.flash_attention and n.kind is OpKind.ATTENTION)
        if recomputed:
            rec += f
    tp_comm = _tp_comm_seconds(graph, nodes, layouts, cfg, cluster, mesh, act)
    p2p = _p2p_seconds(graph, nodes, layouts, cfg, cluster, mesh, act, stage, stage_of)
    dp_comm, dp_exposed = _dp_comm_seconds(graph, nodes, layouts, ctx, cfg, cluster, mesh, bwd + fwd)
    opt = _optimizer_seconds(graph, nodes, layouts, ctx, cluster, calibration)
    return StageTime(stage, fwd, bwd, rec, tp_comm, p2p, dp_comm, dp_exposed, opt)


def _tp_comm_seconds(graph: Graph, nodes: list[Node], layouts: Mapping[str, TensorLayout], cfg: ParallelConfig,
                     cluster: Cluster, mesh: DeviceMesh, act: int) -> float:
    if cfg.tp == 1:
        return 0.0
    link = mesh.link("tp", cluster)
    n_tp = cfg.tp
    seconds = 0.0
    column_inputs: set[str] = set()
    for n in nodes:
        if n.kind not in (OpKind.EINSUM, OpKind.EMBEDDING):
            continue
        ins = [graph.node(i) for i in n.inputs]
        weights = [i for i in ins if i.is_parameter]
        acts = [i for i in ins if not i.is_parameter]
        if not weights or not acts:
            continue
        w_split = {d for d, _ in layouts[weights[0].id].split}
        out_dims = set(dict(n.dims))
        full_bytes = n.numel * act
        if n.kind is OpKind.EMBEDDING or (w_split and not w_split & out_dims):
            # Row-parallel (or vocab-parallel lookup): partial sums to reduce.
            if cfg.sequence_parallel:
                seconds += reduce_scatter_seconds(n_tp, full_bytes, link) + all_gather_seconds(n_tp, full_bytes, link)
            else:
                seconds += all_reduce_seconds(n_tp, full_bytes, link)
        elif w_split & out_dims and acts[0].id not in column_inputs:
            column_inputs.add(acts[0].id)
            in_bytes = acts[0].numel * act
            if cfg.sequence_parallel:
                seconds += all_gather_seconds(n_tp, in_bytes, link) + reduce_scatter_seconds(n_tp, in_bytes, link)
            else:
                seconds += all_reduce_seconds(n_tp, in_bytes, link)
    return seconds


def _p2p_seconds(graph: Graph, nodes: list[Node], layouts: Mapping[str, TensorLayout], cfg: ParallelConfig,
                 cluster: Cluster, mesh: DeviceMesh, act: int, stage: int, stage_of: Mapping[str, int]) -> float:
    """Receive activations from the previous stage and their gradients from the next (one per
    boundary tensor); a send costs the receiver's link time, counted once per boundary."""
    if cfg.pp == 1:
        return 0.0
    link = mesh.link("pp", cluster)
    sizes = dict(mesh.axes)
    seconds = 0.0
    seen: set[str] = set()
    for n in nodes:
        for i in n.inputs:
            src = graph.node(i)
            if src.is_parameter or src.kind is OpKind.INPUT or i in seen or stage_of[i] == stage:
                continue
            seen.add(i)
            nbytes = src.numel * act / layouts[i].shards(sizes)
            seconds += 2 * p2p_seconds(nbytes, link)  # activation in forward, its gradient in backward
    return seconds


def _stage_params(graph: Graph, nodes: list[Node]) -> list[Node]:
    seen: dict[str, Node] = {}
    for n in nodes:
        for i in n.inputs:
            p = graph.node(i)
            if p.is_parameter:
                seen.setdefault(p.id, p)
    return list(seen.values())


def _dp_comm_seconds(graph: Graph, nodes: list[Node], layouts: Mapping[str, TensorLayout], ctx: MemoryContext,
                     cfg: ParallelConfig, cluster: Cluster, mesh: DeviceMesh, mb_compute: float) -> tuple[float, float]:
    """(total, exposed) seconds of data-parallel traffic per step.

    ZeRO 0: all-reduce the gradients; 1-2: reduce-scatter gradients and all-gather updated
    weights; 3: additionally all-gather the weights for every micro-batch's forward and backward
    (hidden behind that micro-batch's compute as far as it lasts). The once-per-step gradient
    traffic hides behind the last micro-batch's backward.
    """
    if cfg.dp == 1:
        return 0.0, 0.0
    axes = [a for a in cfg.data_axes if dict(mesh.axes)[a] > 1]
    link = mesh.group_link(axes, cluster)
    unsharded = MemoryContext(ctx.mesh, ctx.precision, 0, (), ctx.recompute, ctx.flash_attention)
    local = model_state_memory(_stage_params(graph, nodes), lambda p: layouts[p.id], unsharded).bytes
    n = cfg.dp
    if cfg.zero == 0:
        grad_sync = all_reduce_seconds(n, local.gradients, link)
    else:
        grad_sync = reduce_scatter_seconds(n, local.gradients, link) + all_gather_seconds(n, local.parameters, link)
    exposed = max(0.0, grad_sync - mb_compute * 2 / 3)
    total = grad_sync
    if cfg.zero >= 3:
        per_mb = 2 * all_gather_seconds(n, local.parameters, link)
        total += per_mb * cfg.num_microbatches
        exposed += max(0.0, per_mb - mb_compute) * cfg.num_microbatches
    return total, exposed


def _optimizer_seconds(graph: Graph, nodes: list[Node], layouts: Mapping[str, TensorLayout], ctx: MemoryContext,
                       cluster: Cluster, calibration: Calibration) -> float:
    """Adam reads gradients and optimizer states and writes weights and states once."""
    mem = model_state_memory(_stage_params(graph, nodes), lambda p: layouts[p.id], ctx).bytes
    nbytes = mem.gradients + 2 * mem.optimizer_states + mem.parameters
    return nbytes / (cluster.gpu.hbm_bandwidth_bytes_per_s * calibration.memory_efficiency)

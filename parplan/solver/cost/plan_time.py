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

from dataclasses import dataclass

from parplan.solver.calibration import DEFAULT_CALIBRATION, Calibration, apply
from parplan.solver.cluster import Cluster, DeviceMesh
from parplan.solver.cost.collectives import (
    all_gather_seconds,
    all_reduce_seconds,
    p2p_seconds,
    reduce_scatter_seconds,
)
from parplan.solver.cost.plan_memory import model_states, stage_units, unit_strategy
from parplan.solver.cost.precision import Precision, get_precision
from parplan.solver.cost.units import GraphCosts, ParamGroup, TimeEnv
from parplan.solver.errors import StrategyError
from parplan.solver.ir import Graph
from parplan.solver.strategy import ParallelConfig, Schedule


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


def plan_time(graph: Graph, cfg: ParallelConfig, cluster: Cluster, calibration: Calibration = DEFAULT_CALIBRATION,
              costs: GraphCosts | None = None) -> PlanTime:
    """Predicted step time of ``graph`` (built for one micro-batch) under ``cfg`` on ``cluster``."""
    if cfg.world != cluster.num_devices:
        raise StrategyError(f"tp*pp*dp = {cfg.world} but the cluster has {cluster.num_devices} devices")
    gc = costs or GraphCosts(graph)
    cl = apply(cluster, calibration)
    mesh = DeviceMesh.of(cl, cfg.mesh())
    prec = get_precision(cfg.precision)
    s = unit_strategy(cfg)
    env = TimeEnv(cl.gpu, calibration, prec, mesh.link("tp", cl) if cfg.tp > 1 else None)
    unit_stage, by_stage = stage_units(gc, cfg)
    pp_link = mesh.link("pp", cl)
    stages = []
    for stage, units in enumerate(by_stage):
        fwd = bwd = rec = tp = 0.0
        groups: dict[ParamGroup, float] = {}
        for u in units:
            c = gc.unit_cost(u, s, prec, env)
            fwd += c.forward_seconds
            bwd += c.backward_seconds
            rec += c.recompute_seconds
            tp += c.tp_comm_seconds
            for g, e in c.params.items():
                groups[g] = groups.get(g, 0.0) + e
        for g, e in gc.shared_param_elems(units, s).items():
            groups[g] = groups.get(g, 0.0) + e
        boundary = gc.boundary_bytes(units, lambda u: unit_stage.get(u, 0), stage, s, prec.activation_bytes)
        p2p = sum(2 * p2p_seconds(b, pp_link) for b in boundary) if cfg.pp > 1 else 0.0
        dp_comm, dp_exposed = _dp_comm_seconds(groups, cfg, prec, mesh, cl, fwd + bwd)
        opt = _optimizer_seconds(groups, cfg, prec, cl, calibration)
        stages.append(StageTime(stage, fwd, bwd, rec, tp, p2p, dp_comm, dp_exposed, opt))
    m, v = cfg.num_microbatches, cfg.virtual_stages if cfg.schedule is Schedule.INTERLEAVED else 1
    per_mb = [st.microbatch_seconds for st in stages]
    t_max = max(per_mb)
    pipeline = m * t_max + (sum(per_mb) - t_max) / v
    tail = max(st.dp_exposed_seconds + st.optimizer_seconds for st in stages)
    seq = int(graph.meta.get("seq_len", 0) or 0)
    return PlanTime(tuple(stages), pipeline + tail, cfg.global_batch * seq, m)


def _dp_comm_seconds(groups: dict[ParamGroup, float], cfg: ParallelConfig, prec: Precision, mesh: DeviceMesh,
                     cluster: Cluster, mb_compute: float) -> tuple[float, float]:
    """(total, exposed) seconds of data-parallel traffic per step.

    ZeRO 0: all-reduce the gradients; 1-2: reduce-scatter gradients and all-gather updated
    weights; 3: additionally all-gather the weights for every micro-batch's forward and backward
    (hidden behind that micro-batch's compute as far as it lasts). The once-per-step gradient
    traffic hides behind the last micro-batch's backward (two thirds of its compute).
    """
    if cfg.dp == 1:
        return 0.0, 0.0
    axes = [a for a in cfg.data_axes if dict(mesh.axes)[a] > 1]
    link = mesh.group_link(axes, cluster)
    elems = sum(groups.values())
    params, grads = elems * prec.param_bytes, elems * prec.grad_bytes
    n = cfg.dp
    if cfg.zero == 0:
        grad_sync = all_reduce_seconds(n, grads, link)
    else:
        grad_sync = reduce_scatter_seconds(n, grads, link) + all_gather_seconds(n, params, link)
    exposed = max(0.0, grad_sync - mb_compute * 2 / 3)
    total = grad_sync
    if cfg.zero >= 3:
        per_mb = 2 * all_gather_seconds(n, params, link)
        total += per_mb * cfg.num_microbatches
        exposed += max(0.0, per_mb - mb_compute) * cfg.num_microbatches
    return total, exposed


def _optimizer_seconds(groups: dict[ParamGroup, float], cfg: ParallelConfig, prec: Precision, cluster: Cluster,
                       calibration: Calibration) -> float:
    """Adam reads gradients and optimizer states and writes weights and states once."""
    mem = model_states(groups, cfg, prec).bytes
    nbytes = mem.gradients + 2 * mem.optimizer_states + mem.parameters
    return nbytes / (cluster.gpu.hbm_bandwidth_bytes_per_s * calibration.memory_efficiency)

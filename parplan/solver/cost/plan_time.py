"""Step time of a uniform (Megatron-style) strategy.

Per micro-batch and stage: every operator's roofline time (forward, backward = 2x forward, plus a
recomputed forward under recomputation) divided by the devices its work is split over, plus the
tensor-parallel collectives the layouts imply:

- a *row-parallel* einsum (its contracted dim split over ``tp``) leaves partial sums: an
  all-reduce of its output (a reduce-scatter with sequence parallelism) in forward, and with
  sequence parallelism an all-gather of the output gradient in backward;
- a *column-parallel* einsum (weight split on an output dim, input whole) needs its input
  all-gathered in forward with sequence parallelism, and its input gradient all-reduced
  (reduce-scattered) in backward; einsums of one block reading the same input share that collective;
- between stages, one point-to-point send of the boundary activation per micro-batch each way.

A step is ``m·t_max + (Σ_s t_s − t_max)/v`` (1F1B/GPipe with ``v = 1``: the last micro-batch leaves
the pipeline ``Σ_s t_s − t_max`` after the slowest stage finishes its ``m``; interleaving with ``v``
chunks divides that bubble by ``v``), plus the slowest stage's once-per-step work: gradient
synchronisation not hidden behind each layer's backward, and the optimizer step (memory bound).
The accounting is :mod:`parplan.solver.cost.stage_time`'s, through the shared evaluator's memos.
"""

from __future__ import annotations

from parplan.solver.calibration import DEFAULT_CALIBRATION, Calibration
from parplan.solver.cluster import Cluster
from parplan.solver.cost.plan_evaluator import shared_evaluator
from parplan.solver.cost.plan_memory import layer_plan
from parplan.solver.cost.stage_time import PlanTime, StageTime
from parplan.solver.cost.units import GraphCosts
from parplan.solver.errors import StrategyError
from parplan.solver.ir import Graph
from parplan.solver.strategy import ParallelConfig

__all__ = ["PlanTime", "StageTime", "plan_time"]


def plan_time(graph: Graph, cfg: ParallelConfig, cluster: Cluster, calibration: Calibration = DEFAULT_CALIBRATION,
              costs: GraphCosts | None = None) -> PlanTime:
    """Predicted step time of ``graph`` (built for one micro-batch) under ``cfg`` on ``cluster``."""
    if cfg.world != cluster.num_devices:
        cp = "cp*" if cfg.cp > 1 else ""
        raise StrategyError(f"tp*{cp}pp*dp = {cfg.world} but the cluster has {cluster.num_devices} devices")
    gc = costs or GraphCosts(graph)
    return shared_evaluator(gc, cluster, calibration).time(layer_plan(graph, cfg))

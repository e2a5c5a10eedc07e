"""Per-stage memory of a uniform (Megatron-style) strategy, and its most loaded device.

Each pipeline stage's devices hold: the model states of the parameters its nodes use (a tied
embedding used on the first and last stage is resident on both), the saved activations of one
micro-batch times the stage's in-flight count, and temporary buffers (gradient workspaces, a
recomputed block, the logits' gradient, a sequence-parallel gather, FSDP's gathered weights and
unsharded gradients). The stage's peak is the busiest moment of the step, found by walking its
forward and backward (:mod:`parplan.solver.cost.peak`): at most the sum of the categories' peaks.

A uniform strategy is a :class:`~parplan.solver.cost.layer_plan.LayerPlan` whose blocks all agree;
:mod:`parplan.solver.cost.stage_memory` does the accounting, through the shared evaluator's memos.
"""

from __future__ import annotations

from parplan.solver.cost.layer_plan import LayerPlan, LayerStrategy
from parplan.solver.cost.pipeline import blocks_of
from parplan.solver.cost.plan_evaluator import shared_evaluator
from parplan.solver.cost.stage_memory import PlanMemory, StageMemory
from parplan.solver.cost.units import GraphCosts
from parplan.solver.ir import Graph
from parplan.solver.strategy import ParallelConfig, check_divisibility

__all__ = ["PlanMemory", "StageMemory", "layer_plan", "plan_memory"]


def layer_plan(graph: Graph, cfg: ParallelConfig) -> LayerPlan:
    """The uniform strategy ``cfg`` as a per-layer plan (every block the same)."""
    layer = LayerStrategy(tp=cfg.tp, dp=cfg.dp, zero=cfg.zero, sp=cfg.sequence_parallel, recompute=cfg.recompute,
                          tp_inner=True, ep=cfg.expert_parallel, cp=cfg.cp, cp_comm=cfg.cp_comm,
                          dp_shard=cfg.dp_shard, etp=cfg.expert_tensor_parallel or 0)
    return LayerPlan(pp=cfg.pp, num_microbatches=cfg.num_microbatches, global_batch=cfg.global_batch,
                      layers=dict.fromkeys(blocks_of(graph), layer), partition=cfg.partition,
                      schedule=cfg.schedule, virtual_stages=cfg.virtual_stages,
                      flash_attention=cfg.flash_attention, precision=cfg.precision, runtime=cfg.runtime,
                      sync_every_microbatch=cfg.sync_every_microbatch, tp_comm_overlap=cfg.tp_comm_overlap,
                      overlap_param_gather=cfg.overlap_param_gather, overlap_grad_reduce=cfg.overlap_grad_reduce,
                      pp_scatter_gather=cfg.pp_scatter_gather, optimizer_offload=cfg.optimizer_offload)


def plan_memory(graph: Graph, cfg: ParallelConfig, costs: GraphCosts | None = None) -> PlanMemory:
    """Memory of every stage of ``graph`` (built for one micro-batch) under ``cfg``."""
    check_divisibility(graph, cfg)
    gc = costs or GraphCosts(graph)
    return shared_evaluator(gc, None).memory(layer_plan(graph, cfg))

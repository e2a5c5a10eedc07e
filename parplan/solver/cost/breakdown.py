"""Where the time model says one GPU's training step goes, by kind of kernel and by phase.

The categories are the ones a profiled step is sorted into (:mod:`parplan.agent.step_profile`), so
a measured step and its prediction compare category by category:

==============  ==========================================================================
category        operators (the graph's) / kernels (a profiled step's)
==============  ==========================================================================
``gemm``        einsums (linear layers, the LM head; an unfused attention's two products
                are ``attention``'s) / cuBLAS and CUTLASS GEMMs
``attention``   attention cores / flash and memory-efficient attention kernels
``norm``        layer and RMS norms
``elementwise`` activations, dropout, adds, scales, RoPE's products, MoE dispatch/combine
``loss``        softmax outside a flash core, cross-entropy / (log-)softmax, NLL
``embedding``   embedding look-ups and their backward
``copy``        reshapes and concatenations / copies, casts, fills, transposes
``optimizer``   the optimizer step (the evaluator's, once a step)
``other``       reductions / any kernel no rule names
==============  ==========================================================================

One GPU only: no communication is priced here (a single device's step has none).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from parplan.solver.calibration import DEFAULT_CALIBRATION, Calibration
from parplan.solver.cluster import make_cluster
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.layer_plan import LayerStrategy
from parplan.solver.cost.precision import get_precision
from parplan.solver.cost.runtime import Runtime
from parplan.solver.cost.units import GraphCosts, TimeEnv
from parplan.solver.evaluate import evaluate_graph
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.ir import OpKind
from parplan.solver.models import ModelSource
from parplan.solver.strategy import ParallelConfig

#: The kinds of kernel a step's time is sorted into, in the order tables print them.
CATEGORIES = ("gemm", "attention", "norm", "elementwise", "loss", "embedding", "copy", "optimizer", "other")

#: The phases of a step: ``forward`` (with the loss), ``backward`` (with a recomputed forward:
#: it runs inside backward) and ``optimizer``.
PHASES = ("forward", "backward", "optimizer")

#: The category each operator kind's kernels fall in.
KIND_CATEGORY: Mapping[OpKind, str] = {
    OpKind.EINSUM: "gemm", OpKind.ATTENTION: "attention", OpKind.LAYERNORM: "norm", OpKind.RMSNORM: "norm",
    OpKind.ELEMENTWISE: "elementwise", OpKind.DROPOUT: "elementwise", OpKind.DISPATCH: "elementwise",
    OpKind.COMBINE: "elementwise", OpKind.SOFTMAX: "loss", OpKind.CROSS_ENTROPY: "loss",
    OpKind.EMBEDDING: "embedding", OpKind.RESHAPE: "copy", OpKind.CONCAT: "copy", OpKind.REDUCE: "other",
}


@dataclass
class StepBreakdown:
    """Predicted seconds of one step on one GPU: ``phases[phase][category]``, the step the
    evaluator prices (``step_seconds``), and its totals by phase (which the categories add up to)."""

    phases: dict[str, dict[str, float]] = field(default_factory=lambda: {p: dict.fromkeys(CATEGORIES, 0.0)
                                                                          for p in PHASES})
    step_seconds: float = 0.0
    totals: dict[str, float] = field(default_factory=dict)

    def phase_seconds(self, phase: str) -> float:
        return sum(self.phases[phase].values())


def single_gpu_breakdown(cfg: TransformerConfig, micro_batch: int, seq_len: int, recompute: Recompute, gpu: str,
                         runtime: Runtime = Runtime.TORCH, precision: str = "bf16", num_microbatches: int = 1,
                         calibration: Calibration = DEFAULT_CALIBRATION) -> StepBreakdown:
    """The predicted step of ``cfg`` trained on one ``gpu`` (flash attention, ``runtime``'s kernels),
    split by phase and category. Each operator's seconds are those the evaluator adds up
    (:meth:`GraphCosts.operator_seconds`), times ``num_microbatches``; the optimizer is the
    evaluator's."""
    graph = ModelSource(cfg.name, config=cfg).build(micro_batch, seq_len)
    costs = GraphCosts(graph)
    strategy = ParallelConfig(tp=1, pp=1, dp=1, recompute=recompute, micro_batch=micro_batch,
                              num_microbatches=num_microbatches, precision=precision, runtime=runtime,
                              flash_attention=True)
    cluster = make_cluster(1, 1, gpu)
    ev = evaluate_graph(graph, cfg.name, graph.parameter_count(), cluster, strategy, calibration, costs)
    unit = LayerStrategy(recompute=recompute).unit(True, runtime)
    env = TimeEnv(cluster.gpu, calibration, get_precision(precision), None)
    out = StepBreakdown(step_seconds=ev.time.step_seconds)
    for u in costs.units:
        for op in costs.operator_seconds(u, unit, env):
            cat = KIND_CATEGORY.get(op.node.kind, "other")
            out.phases["forward"][cat] += op.forward * num_microbatches
            out.phases["backward"][cat] += (op.backward + op.recompute) * num_microbatches
    stage = ev.time.stages[0]
    out.phases["optimizer"]["optimizer"] = stage.optimizer_seconds
    out.totals = {"forward": stage.forward_seconds * num_microbatches,
                  "backward": (stage.backward_seconds + stage.recompute_seconds) * num_microbatches,
                  "optimizer": stage.optimizer_seconds}
    return out

"""Evaluate one uniform strategy: memory per stage and device, step time, as one report.

This is what ``parplan memory`` prints and what the searches call for every candidate and
baseline. The JSON keys are part of the public contract (docs/design.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from parplan.solver.calibration import DEFAULT_CALIBRATION, Calibration
from parplan.solver.cluster import Cluster
from parplan.solver.cost.plan_memory import PlanMemory, plan_memory
from parplan.solver.cost.plan_time import PlanTime, plan_time
from parplan.solver.cost.units import GraphCosts
from parplan.solver.errors import StrategyError
from parplan.solver.ir import Graph
from parplan.solver.models import ModelSource
from parplan.solver.strategy import ParallelConfig
from parplan.solver.time_accuracy import time_accuracy


@dataclass(frozen=True)
class Evaluation:
    """Memory and time of one strategy for one model on one cluster."""

    model: str
    parameters: int
    seq_len: int
    cluster: Cluster
    strategy: ParallelConfig
    memory: PlanMemory
    time: PlanTime
    calibration: Calibration

    @property
    def fits(self) -> bool:
        return self.memory.peak_bytes <= self.cluster.device_memory_bytes

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-able data (keys per docs/design.md's contract)."""
        peak = self.memory.peak_stage
        s = self.strategy
        return {
            "model": {"name": self.model, "parameters": self.parameters, "seq_len": self.seq_len},
            "cluster": {"gpus": self.cluster.num_devices, "gpus_per_node": self.cluster.gpus_per_node,
                        "gpu": self.cluster.gpu.name, "device_memory_bytes": self.cluster.device_memory_bytes},
            "strategy": {
                "tp": s.tp, "pp": s.pp, "dp": s.dp, "cp": s.cp, "cp_comm": s.cp_comm, "zero": s.zero,
                "sequence_parallel": s.sequence_parallel,
                "recompute": s.recompute.value, "micro_batch": s.micro_batch,
                "num_microbatches": s.num_microbatches, "global_batch": s.global_batch,
                "schedule": s.schedule.value, "virtual_stages": s.virtual_stages,
                "flash_attention": s.flash_attention, "precision": s.precision,
                "expert_parallel": s.expert_parallel, "runtime": s.runtime.value,
                "sync_every_microbatch": s.sync_every_microbatch, "tp_comm_overlap": s.tp_comm_overlap,
                "overlap_param_gather": s.overlap_param_gather, "overlap_grad_reduce": s.overlap_grad_reduce,
                "pp_scatter_gather": s.pp_scatter_gather,
                "summary": s.describe(),
            },
            "memory": {
                "peak_bytes": round(peak.peak_bytes),
                "peak_stage": peak.stage,
                "fits": self.fits,
                "device_memory_bytes": self.cluster.device_memory_bytes,
                "breakdown": peak.memory.bytes.as_dict(),
                "redundant": peak.memory.redundant.as_dict(),
                "stages": [{
                    "stage": st.stage, "first_unit": st.units[0] if st.units else None,
                    "last_unit": st.units[-1] if st.units else None, "peak_bytes": round(st.peak_bytes),
                    "breakdown": st.memory.bytes.as_dict(), "redundant": st.memory.redundant.as_dict(),
                    "in_flight_microbatches": st.in_flight_microbatches,
                    "activation_bytes_per_microbatch": round(st.activation_bytes_per_microbatch),
                } for st in self.memory.stages],
            },
            "time": {
                "step_seconds": self.time.step_seconds,
                "tokens_per_second": self.time.tokens_per_second,
                "samples_per_second": s.global_batch / self.time.step_seconds if self.time.step_seconds else 0.0,
                "bubble_fraction": self.time.bubble_fraction,
                "calibration": self.calibration.source,
                "accuracy": time_accuracy(self.calibration, self.cluster.gpu.name, s.runtime.value),
                "stages": [{
                    "stage": t.stage, "forward_seconds": t.forward_seconds, "backward_seconds": t.backward_seconds,
                    "recompute_seconds": t.recompute_seconds, "tp_comm_seconds": t.tp_comm_seconds,
                    "p2p_seconds": t.p2p_seconds, "dp_comm_seconds": t.dp_comm_seconds,
                    "dp_exposed_seconds": t.dp_exposed_seconds, "optimizer_seconds": t.optimizer_seconds,
                    **({"cp_comm_seconds": t.cp_comm_seconds} if s.cp > 1 else {}),
                    **({"ep_comm_seconds": t.ep_comm_seconds} if s.expert_parallel > 1 else {}),
                } for t in self.time.stages],
            },
        }


def evaluate_graph(graph: Graph, name: str, parameters: int, cluster: Cluster, strategy: ParallelConfig,
                   calibration: Calibration = DEFAULT_CALIBRATION, costs: GraphCosts | None = None) -> Evaluation:
    """Evaluate ``strategy`` for a graph already built for one micro-batch (``costs``: a unit-cost
    cache of that graph to reuse across evaluations)."""
    if strategy.world != cluster.num_devices:
        cp = f" x {strategy.cp}" if strategy.cp > 1 else ""
        raise StrategyError(f"tp{' x cp' if cp else ''} x pp x dp = {strategy.tp}{cp} x {strategy.pp} x {strategy.dp} "
                            f"= {strategy.world} does not match the {cluster.num_devices} devices")
    gc = costs or GraphCosts(graph)
    mem = plan_memory(graph, strategy, gc)
    t = plan_time(graph, strategy, cluster, calibration, gc)
    return evaluation_of(graph, name, parameters, cluster, strategy, mem, t, calibration)


def evaluation_of(graph: Graph, name: str, parameters: int, cluster: Cluster, strategy: ParallelConfig,
                  memory: PlanMemory, time: PlanTime, calibration: Calibration) -> Evaluation:
    """The report of ``strategy``'s memory and time, priced for ``graph`` (whose sequence length it
    gives)."""
    seq = int(graph.meta.get("seq_len", 0) or 0)
    return Evaluation(name, parameters, seq, cluster, strategy, memory, time, calibration)


def evaluate(model: ModelSource, cluster: Cluster, strategy: ParallelConfig, seq_len: int | None = None,
             calibration: Calibration = DEFAULT_CALIBRATION) -> Evaluation:
    """Build ``model`` for the strategy's micro-batch and evaluate it."""
    graph = model.build(strategy.micro_batch, seq_len)
    return evaluate_graph(graph, model.name, graph.parameter_count(), cluster, strategy, calibration)

"""Evaluate one uniform strategy: memory per stage and device, step time, as one report.

This is what ``parplan memory`` prints and what the searches call for every candidate and
baseline. The JSON keys are part of the public contract (docs/design.md).
"""

from __future__ import annotations

from parplan.solver.calibration import DEFAULT_CALIBRATION, Calibration
from parplan.solver.cluster import Cluster
from parplan.solver.cost.plan_memory import PlanMemory, plan_memory
from parplan.solver.cost.plan_time import PlanTime, plan_time
from parplan.solver.cost.units import GraphCosts
from parplan.solver.errors import StrategyError
from parplan.solver.ir import Graph
from parplan.solver.models import ModelSource
from parplan.solver.result import Evaluation
from parplan.solver.strategy import ParallelConfig


class GraphProvider:
    """The graphs of one model at one sequence length, each micro-batch size built once, with its
    unit-cost cache: one per solve, shared by the baselines and the searches. ``builds`` counts the
    graphs built."""

    def __init__(self, model: ModelSource, seq_len: int | None) -> None:
        self.model = model
        self.seq_len = seq_len
        self._graphs: dict[int, Graph] = {}
        self._costs: dict[int, GraphCosts] = {}
        self.builds = 0

    def graph(self, micro_batch: int) -> Graph:
        """The graph of one micro-batch of ``micro_batch`` samples."""
        if micro_batch not in self._graphs:
            self._graphs[micro_batch] = self.model.build(micro_batch, self.seq_len)
            self._costs[micro_batch] = GraphCosts(self._graphs[micro_batch])
            self.builds += 1
        return self._graphs[micro_batch]

    def costs(self, micro_batch: int) -> GraphCosts:
        """The unit-cost cache of :meth:`graph` (its unit prices shared by every search using it)."""
        self.graph(micro_batch)
        return self._costs[micro_batch]


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

"""Uniform strategies: enumeration, and the hand-made baselines every plan is compared with.

- ``megatron``: what a Megatron-LM user would pick — TP inside a node (with sequence parallelism),
  PP across nodes, DP for the rest, the distributed optimizer on or off, selective or full
  recomputation, the micro-batch size — the fastest such configuration that fits;
- ``zero3``: fully sharded data parallelism (ZeRO-3 / FSDP), no TP or PP;
- ``dp``: plain data parallelism (DDP), no sharding.

Each is the fastest configuration of its family that fits the memory budget; when none fits, the
one needing the least memory is reported with ``fits = False``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from parplan.solver.calibration import DEFAULT_CALIBRATION, Calibration
from parplan.solver.cluster import Cluster
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.plan_memory import PlanMemory, plan_memory
from parplan.solver.cost.plan_time import PlanTime, plan_time
from parplan.solver.cost.units import GraphCosts
from parplan.solver.errors import SolverError
from parplan.solver.evaluate import Evaluation, evaluation_of
from parplan.solver.ir import Graph
from parplan.solver.models import ModelSource
from parplan.solver.strategy import ParallelConfig

BASELINES = ("megatron", "zero3", "dp")


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class Candidate:
    """One uniform configuration before evaluation."""

    tp: int
    pp: int
    dp: int
    zero: int
    sp: bool
    recompute: Recompute
    micro_batch: int


def enumerate_uniform(cluster: Cluster, global_batch: int, num_blocks: int, *, tp_max: int | None = None,
                      pp_choices: Iterable[int] | None = None, zeros: Iterable[int] = (0, 1, 2, 3),
                      recomputes: Iterable[Recompute] = (Recompute.SELECTIVE, Recompute.FULL),
                      micro_batches: Iterable[int] = (1, 2, 4, 8), allow_sp: bool = True) -> Iterator[Candidate]:
    """Every uniform configuration whose degrees factor the devices and the batch."""
    n = cluster.num_devices
    tp_cap = tp_max if tp_max is not None else cluster.gpus_per_node
    pps = list(pp_choices) if pp_choices is not None else divisors(n)
    for tp in divisors(n):
        if tp > tp_cap:
            continue
        for pp in pps:
            if (n // tp) % pp or pp > num_blocks:
                continue
            dp = n // (tp * pp)
            for mb in micro_batches:
                if global_batch % (mb * dp):
                    continue
                for zero in zeros:
                    if dp == 1 and zero:
                        continue
                    for sp in ((False, True) if tp > 1 and allow_sp else (False,)):
                        for rc in recomputes:
                            yield Candidate(tp, pp, dp, zero, sp, rc, mb)


class UniformEvaluator:
    """Evaluates candidates, building each micro-batch's graph once."""

    def __init__(self, model: ModelSource, cluster: Cluster, global_batch: int, seq_len: int | None,
                 calibration: Calibration = DEFAULT_CALIBRATION, precision: str = "bf16") -> None:
        self.model = model
        self.cluster = cluster
        self.global_batch = global_batch
        self.seq_len = seq_len
        self.calibration = calibration
        self.precision = precision
        self._graphs: dict[int, Graph] = {}
        self._costs: dict[int, GraphCosts] = {}
        self.evaluations = 0
        self.memory_evaluations = 0

    def graph(self, micro_batch: int) -> Graph:
        if micro_batch not in self._graphs:
            self._graphs[micro_batch] = self.model.build(micro_batch, self.seq_len)
            self._costs[micro_batch] = GraphCosts(self._graphs[micro_batch])
        return self._graphs[micro_batch]

    def costs(self, micro_batch: int) -> GraphCosts:
        """The unit-cost cache of the graph built for ``micro_batch`` (shared with other searches)."""
        self.graph(micro_batch)
        return self._costs[micro_batch]

    def config(self, c: Candidate) -> ParallelConfig:
        return ParallelConfig(tp=c.tp, pp=c.pp, dp=c.dp, zero=c.zero, sequence_parallel=c.sp, recompute=c.recompute,
                              micro_batch=c.micro_batch, num_microbatches=self.global_batch // (c.micro_batch * c.dp),
                              precision=self.precision)

    def evaluate(self, c: Candidate) -> Evaluation | None:
        """The evaluation, or None when the strategy does not apply to the model (e.g. TP > heads)."""
        t = self.time_of(c)
        mem = self.memory_of(c) if t is not None else None
        return self.evaluation(c, mem, t) if mem is not None and t is not None else None

    def time_of(self, c: Candidate) -> PlanTime | None:
        """The step time alone (None: the strategy does not apply); counted in ``evaluations``."""
        g = self.graph(c.micro_batch)
        self.evaluations += 1
        try:
            return plan_time(g, self.config(c), self.cluster, self.calibration, self._costs[c.micro_batch])
        except SolverError:
            return None

    def memory_of(self, c: Candidate) -> PlanMemory | None:
        """The memory alone (None: the strategy does not apply); counted in ``memory_evaluations``."""
        g = self.graph(c.micro_batch)
        self.memory_evaluations += 1
        try:
            return plan_memory(g, self.config(c), self._costs[c.micro_batch])
        except SolverError:
            return None

    def evaluation(self, c: Candidate, mem: PlanMemory, t: PlanTime) -> Evaluation:
        g = self.graph(c.micro_batch)
        return evaluation_of(g, self.model.name, g.parameter_count(), self.cluster, self.config(c), mem, t,
                             self.calibration)


def best_of(evals: Iterable[Evaluation], budget_bytes: float) -> Evaluation | None:
    """Fastest evaluation within the budget; if none fits, the one needing the least memory."""
    fitting: list[Evaluation] = []
    smallest: Evaluation | None = None
    for e in evals:
        if e.memory.peak_bytes <= budget_bytes:
            fitting.append(e)
        if smallest is None or e.memory.peak_bytes < smallest.memory.peak_bytes:
            smallest = e
    if fitting:
        return min(fitting, key=lambda e: (e.time.step_seconds, e.memory.peak_bytes))
    return smallest


def fastest_fitting(ev: UniformEvaluator, cands: Iterable[Candidate], budget_bytes: float) -> Evaluation | None:
    """:func:`best_of` the candidates' evaluations, pricing memory only where it can matter.

    Every candidate's step time is priced; memory (the dearer half) only in order of time until one
    fits, and for the candidates as fast as it (the tie goes to the least memory). When none fits,
    every memory is priced to find the least. The answer is the one :func:`best_of` gives."""
    timed = [(c, t) for c in cands if (t := ev.time_of(c)) is not None]
    memory: dict[int, PlanMemory | None] = {}

    def mem(i: int) -> PlanMemory | None:
        if i not in memory:
            memory[i] = ev.memory_of(timed[i][0])
        return memory[i]

    best: tuple[float, float, int, PlanMemory] | None = None  # (seconds, peak bytes, index, memory)
    for i in sorted(range(len(timed)), key=lambda i: timed[i][1].step_seconds):  # stable: ties in given order
        secs = timed[i][1].step_seconds
        if best is not None and secs > best[0]:
            break
        m = mem(i)
        if m is not None and m.peak_bytes <= budget_bytes and (best is None or (secs, m.peak_bytes) < best[:2]):
            best = (secs, m.peak_bytes, i, m)
    if best is None:  # none fits: the least memory, first in the given order
        for i in range(len(timed)):
            m = mem(i)
            if m is not None and (best is None or m.peak_bytes < best[1]):
                best = (timed[i][1].step_seconds, m.peak_bytes, i, m)
    if best is None:
        return None
    c, t = timed[best[2]]
    return ev.evaluation(c, best[3], t)


def _family(name: str, cluster: Cluster, global_batch: int, num_blocks: int) -> Iterator[Candidate]:
    if name == "megatron":
        # TP inside a node (always with sequence parallelism), PP and DP for the rest.
        for c in enumerate_uniform(cluster, global_batch, num_blocks, zeros=(0, 1)):
            if cluster.gpus_per_node % c.tp == 0 and (c.tp > 1) == c.sp:
                yield c
    elif name == "zero3":
        yield from enumerate_uniform(cluster, global_batch, num_blocks, tp_max=1, pp_choices=(1,), zeros=(3,))
    elif name == "dp":
        yield from enumerate_uniform(cluster, global_batch, num_blocks, tp_max=1, pp_choices=(1,), zeros=(0,))
    else:
        raise SolverError(f"unknown baseline {name!r}; known: {', '.join(BASELINES)}")


def baseline(name: str, ev: UniformEvaluator, budget_bytes: float, num_blocks: int) -> Evaluation | None:
    """The baseline ``name``: the fastest of its family that fits (or the smallest if none does)."""
    return fastest_fitting(ev, _family(name, ev.cluster, ev.global_batch, num_blocks), budget_bytes)

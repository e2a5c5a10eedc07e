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

import heapq
from collections.abc import Container, Iterable, Iterator
from dataclasses import dataclass, replace

from parplan.solver.calibration import DEFAULT_CALIBRATION, Calibration
from parplan.solver.cluster import Cluster
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.compute import backward_flops, forward_flops, math_peak
from parplan.solver.cost.kernels import efficiency_bound
from parplan.solver.cost.nanotron import partition_of
from parplan.solver.cost.pipeline import blocks_of
from parplan.solver.cost.plan_memory import PlanMemory, plan_memory
from parplan.solver.cost.plan_time import PlanTime, plan_time
from parplan.solver.cost.precision import get_precision
from parplan.solver.cost.rules import compute_dtype, recomputed, search_recomputes
from parplan.solver.cost.runtime import Runtime
from parplan.solver.cost.unit_strategy import UnitStrategy
from parplan.solver.cost.units import GraphCosts
from parplan.solver.device_memory import host_verdict
from parplan.solver.errors import SolverError
from parplan.solver.evaluate import GraphProvider, evaluation_of
from parplan.solver.ir import Graph
from parplan.solver.models import ModelSource
from parplan.solver.objective import Objective
from parplan.solver.result import Evaluation
from parplan.solver.strategy import ParallelConfig, Schedule, hybrid_groups

BASELINES = ("megatron", "zero3", "dp")


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class Candidate:
    """One uniform configuration before evaluation (``virtual``: model chunks per device under the
    interleaved schedule; ``ep``: expert-parallel degree, dividing ``dp``; ``dp_shard``: the shard
    group of hybrid sharding, 0 for ZeRO over all of ``dp``)."""

    tp: int
    pp: int
    dp: int
    zero: int
    sp: bool
    recompute: Recompute
    micro_batch: int
    schedule: Schedule = Schedule.ONE_F_ONE_B
    virtual: int = 1
    ep: int = 1
    offload: float = 0.0  # the optimizer's fraction on the host (ParallelConfig.optimizer_offload)
    dp_shard: int = 0


#: Micro-batch sizes the uniform families try when none is given.
MICRO_BATCHES = (1, 2, 4, 8)


def micro_batch_choices(micro_batch: int | None) -> tuple[int, ...]:
    """The micro-batch sizes uniform strategies take: the one given, else :data:`MICRO_BATCHES`."""
    return (micro_batch,) if micro_batch else MICRO_BATCHES


def enumerate_uniform(cluster: Cluster, global_batch: int, num_blocks: int, *, tp_max: int | None = None,
                      pp_choices: Iterable[int] | None = None, zeros: Iterable[int] = (0, 1, 2, 3),
                      recomputes: Iterable[Recompute] = (Recompute.SELECTIVE, Recompute.FULL),
                      micro_batches: Iterable[int] = MICRO_BATCHES, allow_sp: bool = True) -> Iterator[Candidate]:
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
                 calibration: Calibration = DEFAULT_CALIBRATION, precision: str = "bf16",
                 runtime: Runtime = Runtime.MEGATRON, graphs: GraphProvider | None = None,
                 micro_batch: int | None = None) -> None:
        self.model = model
        self.micro_batch = micro_batch  # the micro-batch every family member takes (None: searched)
        self.graphs = graphs or GraphProvider(model, seq_len)
        self.runtime = runtime
        self.cluster = cluster
        self.global_batch = global_batch
        self.seq_len = seq_len
        self.calibration = calibration
        self.precision = precision
        self.evaluations = 0
        self.memory_evaluations = 0
        self._times: dict[Candidate, PlanTime | None] = {}
        self._memories: dict[Candidate, PlanMemory | None] = {}
        self._parameters: int | None = None
        self._compute: dict[tuple[int, Recompute], float] = {}  # -> seconds of arithmetic at least
        self._saved: dict[tuple[int, int, bool, int, Recompute], float] = {}  # -> one micro-batch's saved bytes

    def graph(self, micro_batch: int) -> Graph:
        """The graph of one micro-batch (:class:`~parplan.solver.evaluate.GraphProvider`)."""
        return self.graphs.graph(micro_batch)

    def costs(self, micro_batch: int) -> GraphCosts:
        """The unit-cost cache of the graph built for ``micro_batch`` (shared with other searches)."""
        return self.graphs.costs(micro_batch)

    def config(self, c: Candidate) -> ParallelConfig:
        """The candidate as a strategy. Under Megatron-LM's buffers the distributed optimizer (ZeRO-1
        over more than one rank) runs with ``--overlap-param-gather``: it costs no memory and hides
        the updated weights' all-gather under the next forward, so a plan without it is never the
        better one (the export passes the flag on)."""
        return ParallelConfig(tp=c.tp, pp=c.pp, dp=c.dp, zero=c.zero, sequence_parallel=c.sp, recompute=c.recompute,
                              micro_batch=c.micro_batch, num_microbatches=self.global_batch // (c.micro_batch * c.dp),
                              precision=self.precision, runtime=self.runtime, schedule=c.schedule,
                              virtual_stages=c.virtual, expert_parallel=c.ep, optimizer_offload=c.offload,
                              dp_shard=c.dp_shard,
                              overlap_param_gather=self.runtime is Runtime.MEGATRON and c.zero == 1 and c.dp > 1,
                              partition=partition_of(self.model.config, c.pp) if self.runtime.nanotron
                              else None)

    def evaluate(self, c: Candidate) -> Evaluation | None:
        """The evaluation, or None when the strategy does not apply to the model (e.g. TP > heads)."""
        t = self.time_of(c)
        mem = self.memory_of(c) if t is not None else None
        return self.evaluation(c, mem, t) if mem is not None and t is not None else None

    def time_of(self, c: Candidate) -> PlanTime | None:
        """The step time alone (None: the strategy does not apply); priced once per candidate,
        counted in ``evaluations``."""
        if c in self._times:
            return self._times[c]
        g = self.graph(c.micro_batch)
        self.evaluations += 1
        try:
            t: PlanTime | None = plan_time(g, self.config(c), self.cluster, self.calibration,
                                           self.costs(c.micro_batch))
        except SolverError:
            t = None
        self._times[c] = t
        return t

    def time_floor(self, c: Candidate) -> float:
        """Seconds per step ``c`` takes at least, without pricing it: every operator's arithmetic
        (forward, backward, and the forward again where ``c``'s recomputation repeats it,
        :func:`~parplan.solver.cost.rules.recomputed`) at its dtype's peak and the most its kernel
        can reach (:func:`~parplan.solver.cost.kernels.efficiency_bound`), cut over at most
        ``tp·ep`` devices per stage,
        through a pipeline whose busiest stage holds at least ``1/pp`` of it. The step is ``m·t_max +
        (Σ − t_max)/v + once`` (:func:`~parplan.solver.cost.plan_evaluator.pipeline_seconds`), at
        least ``Σ/pp·(m + (pp − 1)/v)`` (``Σ/pp·m`` under a zero-bubble schedule). A test checks it
        against every configuration priced."""
        key = (c.micro_batch, c.recompute)
        if key not in self._compute:
            g = self.graph(c.micro_batch)
            flash = ParallelConfig.flash_attention  # (the baselines price the default kernel)
            prec = get_precision(self.precision)
            gpu, cal = self.cluster.gpu, self.calibration
            seconds = 0.0
            for n in g.nodes:
                if n.is_leaf:
                    continue
                again = recomputed(n, c.recompute, flash, self.runtime, g)
                flops = forward_flops(n, g) * (2 if again else 1) + backward_flops(n, g)
                if flops:
                    dt = compute_dtype(n, prec, g)
                    seconds += flops / (math_peak(gpu, dt) * efficiency_bound(n, g, gpu, cal, dt, self.runtime))
            self._compute[key] = seconds
        m = self.global_batch // (c.micro_batch * c.dp)
        v = c.virtual if c.schedule is Schedule.INTERLEAVED else 1
        # a zero-bubble schedule's bubble can be all but filled by weight gradients: none counted
        bubble = 0.0 if c.schedule.zero_bubble else (c.pp - 1) / v
        per_microbatch = self._compute[key] / (c.tp * c.ep)  # Σ over the stages, at least
        return per_microbatch / c.pp * (m + bubble) * (1 - 1e-9)  # (rounding: never above)

    def states_floor(self, c: Candidate) -> float:
        """Bytes per device ``c`` holds at least, without pricing it: every parameter's weights,
        gradients and optimizer states cut over the ``tp·pp`` devices of one data-parallel replica
        (the busiest stage holds at least the average), each category also over the ranks ZeRO
        shards over (``dp``, or the shard group of hybrid sharding) where the ZeRO stage can shard it
        (weights from stage 2, as PyTorch shards them)."""
        return sum(self._states_floor_parts(c))

    def _states_floor_parts(self, c: Candidate) -> tuple[float, float]:
        """:meth:`states_floor` as (weights and optimizer states, gradients)."""
        if self._parameters is None:
            self._parameters = self.graph(1).parameter_count()  # (the same at every micro-batch size)
        # the runtime's own bytes per parameter (a runtime whose master copy is the weight keeps none
        # apart); DDP's bucket copy, which only adds, is left out
        prec = self.runtime.states_precision(get_precision(self.precision))
        # expert parallelism cuts the experts' share further; cutting every parameter by it keeps a bound
        per_replica = self._parameters / (c.tp * c.pp * c.ep)
        shard = hybrid_groups(c.dp, c.dp_shard)[0]
        grads = per_replica * prec.grad_bytes / (shard if c.zero >= 2 else 1)
        return per_replica * (prec.param_bytes / (shard if c.zero >= 2 else 1)
                              + prec.optimizer_state_bytes * (1 - c.offload) / (shard if c.zero >= 1 else 1)), grads

    def memory_floor(self, c: Candidate) -> float:
        """Bytes per device ``c`` holds at least, without pricing it: :meth:`states_floor` plus
        :meth:`activations_floor` where the runtime keeps its gradients between steps
        (:attr:`~parplan.solver.cost.runtime.Runtime.keeps_gradients`); where it makes them in each
        step's backward (torchtitan), the weights and optimizer states plus the larger of the
        gradients (all alive once backward ends) and the activations (before it starts)."""
        base, grads = self._states_floor_parts(c)
        acts = self.activations_floor(c)
        held = base + grads + acts if self.runtime.keeps_gradients else base + max(grads, acts)
        return held * (1 - 1e-9)  # (rounding: never above)

    def activations_floor(self, c: Candidate) -> float:
        """Saved activation bytes per device ``c`` holds at least, without pricing the plan: one
        micro-batch's of every block (each unit's own saved tensors under ``c``'s TP, sequence and
        expert parallelism and recomputation, :attr:`~parplan.solver.cost.units.UnitCost.act_bytes`;
        tensors several units share are left out) over the ``pp`` stages. Before a device's first
        backward it holds micro-batch 0's saved tensors of every layer it runs (a layer's are freed
        by its own backward, which comes after the device's first, whatever the schedule), and the
        busiest stage holds at least the average (with :meth:`states_floor`, the average of the
        stages' states). 0 where the blocks cannot be priced under ``c``."""
        key = (c.micro_batch, c.tp, c.sp, c.ep, c.recompute)
        if key not in self._saved:
            unit = UnitStrategy(tp=c.tp, sp=c.sp, ep=c.ep, recompute=c.recompute,
                                flash_attention=ParallelConfig.flash_attention, runtime=self.runtime)
            prec = get_precision(self.precision)
            try:
                gc = self.costs(c.micro_batch)
                self._saved[key] = sum(gc.unit_cost(u, unit, prec).act_bytes for u in blocks_of(gc.graph))
            except SolverError:
                self._saved[key] = 0.0
        return self._saved[key] / c.pp

    def memory_of(self, c: Candidate) -> PlanMemory | None:
        """The memory alone (None: the strategy does not apply); priced once per candidate, counted
        in ``memory_evaluations``."""
        if c in self._memories:
            return self._memories[c]
        g = self.graph(c.micro_batch)
        self.memory_evaluations += 1
        try:
            m: PlanMemory | None = plan_memory(g, self.config(c), self.costs(c.micro_batch))
        except SolverError:
            m = None
        self._memories[c] = m
        return m

    def host_fits(self, c: Candidate, mem: PlanMemory) -> bool:
        """Whether ``c``'s offloaded optimizer fits its machines' host memory (no offloading: it does)."""
        return not c.offload or host_verdict(mem.host_bytes_per_device, self.cluster).fits

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
    """:func:`best_of` the candidates' evaluations, pricing only what can change the answer.

    A candidate whose least possible memory (:meth:`UniformEvaluator.memory_floor`: its model
    states and one micro-batch's saved activations) exceeds the budget cannot fit: it is not
    priced. The others are taken best first: by their step time once priced, by their least
    possible time (:meth:`UniformEvaluator.time_floor`) until then; a candidate
    comes up unpriced is priced and goes back by its time, one comes up priced has its memory (the
    dearer half) priced. The first that fits is the fastest, and the candidates that come up as
    fast as it are priced too (the tie goes to the least memory, then to the first given); the
    rest cannot be faster and are never priced. A Megatron-LM module set waits for its lighter
    counterpart (:func:`_lighter_counterparts`), whose step time bounds its own, and is dropped where that
    one is known to fit. When none fits, memory is priced in order of the
    floor until the floor is above the least memory found. The answer is the one :func:`best_of`
    gives."""
    every = list(cands)
    floor = [ev.memory_floor(c) for c in every]
    times: dict[int, PlanTime | None] = {}
    memory: dict[int, PlanMemory | None] = {}

    def tim(i: int) -> PlanTime | None:
        if i not in times:
            times[i] = ev.time_of(every[i])
        return times[i]

    def mem(i: int) -> PlanMemory | None:
        if i not in memory:
            memory[i] = ev.memory_of(every[i])
        return memory[i]

    # (seconds, rank, index): rank 0 the least possible seconds until priced, 1 the step's (its memory
    # next), 2 a module set waiting behind its lighter counterpart's step time
    queue = [(ev.time_floor(every[i]), 0, i) for i in range(len(every)) if floor[i] <= budget_bytes]
    heapq.heapify(queue)
    lighter = _lighter_counterparts(every)
    best: tuple[float, float, int, PlanMemory] | None = None  # (seconds, peak bytes, index, memory)
    while queue:
        secs, rank, i = heapq.heappop(queue)
        if best is not None and secs > best[0]:
            break  # neither it nor anything after it is as fast as the answer
        j = lighter.get(i)
        light = times.get(j) if j is not None and rank != 1 else None
        if j is not None and light is not None:
            # a module set reruns more than its lighter counterpart: never faster than it where it fits,
            # at least its step time where it does not
            m = memory.get(j)
            if m is not None and m.peak_bytes <= budget_bytes and ev.host_fits(every[j], m):
                continue
            if rank == 0 and light.step_seconds >= secs:
                heapq.heappush(queue, (light.step_seconds, 2, i))
                continue
        if rank != 1:
            t = tim(i)
            if t is not None:
                heapq.heappush(queue, (t.step_seconds, 1, i))
            continue
        m = mem(i)
        if m is not None and m.peak_bytes <= budget_bytes and ev.host_fits(every[i], m) \
                and (best is None or (secs, m.peak_bytes, i) < best[:3]):
            best = (secs, m.peak_bytes, i, m)
    if best is None:  # none fits: the least memory, first in the given order among equal ones
        for i in sorted(range(len(every)), key=lambda i: floor[i]):
            if best is not None and floor[i] > best[1]:
                break
            m = mem(i)
            if m is None or (best is not None and (m.peak_bytes, i) >= (best[1], best[2])):
                continue
            t = tim(i)
            if t is not None:
                best = (t.step_seconds, m.peak_bytes, i, m)
    if best is None:
        return None
    t = times[best[2]]
    assert t is not None
    return ev.evaluation(every[best[2]], best[3], t)


def _lighter_counterparts(every: list[Candidate]) -> dict[int, int]:
    """For each candidate recomputing Megatron-LM modules (:attr:`Recompute.per_module`), the index
    of the same candidate with its attention-core policy alone (none or selective), where given:
    its step time is at least that one's (the same step with more forward run again)."""
    index = {c: i for i, c in enumerate(every)}
    out: dict[int, int] = {}
    for i, c in enumerate(every):
        if c.recompute.per_module:
            j = index.get(replace(c, recompute=Recompute.of_modules(c.recompute.modules & {"core_attn"})))
            if j is not None:
                out[i] = j
    return out


def least_memory_within(ev: UniformEvaluator, cands: Iterable[Candidate], budget_bytes: float,
                        objective: Objective, fastest_seconds: float) -> Evaluation | None:
    """The candidate that fits the budget with the best ``min-memory`` score (:class:`Objective`)
    given the fastest plan known (``fastest_seconds``): the least peak memory among those meeting
    the objective's time limit (ties: the faster, then the first given); with ``alpha``, the least
    ``memory + alpha·time`` over every fitting candidate instead.
    Exact: memory is priced in order of the least possible memory
    (:meth:`UniformEvaluator.memory_floor`) until the floor cannot beat the best found; a candidate
    whose least possible time (:meth:`UniformEvaluator.time_floor`) misses the limit (or whose
    floors together cannot beat the best score) is not priced; a Megatron-LM module set's least time is
    at least its lighter counterpart's step time (:func:`_lighter_counterparts`)."""
    every = list(cands)
    floor = [ev.memory_floor(c) for c in every]
    limit = objective.time_limit(fastest_seconds)
    alpha = objective.alpha_bytes_per_s
    best: tuple[float, float, int, PlanMemory, PlanTime] | None = None  # (score, seconds, index, ...)
    lighter = _lighter_counterparts(every)
    for i in sorted(range(len(every)), key=lambda i: floor[i]):
        if floor[i] > budget_bytes or (best is not None and floor[i] > best[0]):
            break  # memory (and memory + alpha·time) is at least the floor
        least = ev.time_floor(every[i])
        if i in lighter and (light := ev.time_of(every[lighter[i]])) is not None:
            # a module set's step is at least its lighter counterpart's, priced once for all its sets
            least = max(least, light.step_seconds)
        if (not objective.meets(least, limit) if alpha is None
                else best is not None and objective.score(floor[i], least)[0] > best[0]):
            continue
        t = ev.time_of(every[i])
        if t is None or not objective.meets(t.step_seconds, limit):
            continue
        m = ev.memory_of(every[i])
        if m is None or m.peak_bytes > budget_bytes or not ev.host_fits(every[i], m):
            continue
        score = objective.score(m.peak_bytes, t.step_seconds)
        if best is None or (*score, i) < best[:3]:
            best = (*score, i, m, t)
    if best is None:
        return None
    return ev.evaluation(every[best[2]], best[3], best[4])


def _family(name: str, cluster: Cluster, global_batch: int, num_blocks: int, runtime: Runtime,
            mbs: tuple[int, ...] = MICRO_BATCHES) -> Iterator[Candidate]:
    rcs = search_recomputes(runtime, ParallelConfig.flash_attention)  # (the baselines price the default kernel)
    if name == "megatron":
        # TP inside a node (always with sequence parallelism), PP and DP for the rest.
        for c in enumerate_uniform(cluster, global_batch, num_blocks, zeros=(0, 1), recomputes=rcs,
                                   micro_batches=mbs):
            if cluster.gpus_per_node % c.tp == 0 and (c.tp > 1) == c.sp:
                yield c
    elif name == "zero3":
        yield from enumerate_uniform(cluster, global_batch, num_blocks, tp_max=1, pp_choices=(1,), zeros=(3,),
                                     recomputes=rcs, micro_batches=mbs)
    elif name == "dp":
        yield from enumerate_uniform(cluster, global_batch, num_blocks, tp_max=1, pp_choices=(1,), zeros=(0,),
                                     recomputes=rcs, micro_batches=mbs)
    else:
        raise SolverError(f"unknown baseline {name!r}; known: {', '.join(BASELINES)}")


def least_memory_member(ev: UniformEvaluator, budget_bytes: float, num_blocks: int, objective: Objective,
                        fastest_seconds: float, runnable: Container[Candidate] | None = None) -> Evaluation | None:
    """The member of any baseline family (with ``runnable``, of those members only) that fits with
    the best ``min-memory`` score given the fastest plan known (:func:`least_memory_within`): the
    obvious plan a ``min-memory`` answer must beat, where each baseline is its family's fastest."""
    seen: set[Candidate] = set()
    members: list[Candidate] = []
    for name in BASELINES:
        for c in _family(name, ev.cluster, ev.global_batch, num_blocks, ev.runtime,
                         micro_batch_choices(ev.micro_batch)):
            if c not in seen and (runnable is None or c in runnable):
                seen.add(c)
                members.append(c)
    return least_memory_within(ev, members, budget_bytes, objective, fastest_seconds)


def baseline(name: str, ev: UniformEvaluator, budget_bytes: float, num_blocks: int,
             runnable: Container[Candidate] | None = None) -> Evaluation | None:
    """The baseline ``name``: the fastest of its family that fits (or the smallest if none does);
    with ``runnable``, of those members only (a target's own baseline: what its trainer runs)."""
    family = _family(name, ev.cluster, ev.global_batch, num_blocks, ev.runtime, micro_batch_choices(ev.micro_batch))
    return fastest_fitting(ev, (c for c in family if runnable is None or c in runnable), budget_bytes)

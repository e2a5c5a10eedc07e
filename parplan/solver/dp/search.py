"""Galvatron-BMW's search: pipeline degree, micro-batching, partition, and a DP per stage.

For every pipeline degree ``p`` (dividing the devices, at most the number of blocks) and micro-batch
count ``m``:

1. every block is priced under every strategy of the decision tree (:mod:`.space`) on its stage —
   time per step (``m`` micro-batches plus the once-per-step gradient sync and optimizer work),
   memory (model states plus its activations times the stage's in-flight micro-batches), and its
   temporary buffers — with :class:`~parplan.solver.cost.plan_evaluator.PlanEvaluator`, the cost model the
   baselines use; embedding, LM head and the like are priced with the block next to them;
2. partitions are tried from the *memory-balanced* one (stage memory as even as possible, later
   stages holding fewer micro-batches get more blocks) towards the *time-balanced* one, stopping at
   the first that no longer fits (the bi-objective procedure); the even split is tried too;
3. each stage is solved by :func:`~parplan.solver.dp.dynamic.solve_stage` under the budget left
   after its largest temporary buffer, which gives its least time for every smaller budget too.

``max-throughput`` keeps the fastest plan; ``min-memory`` then lowers the memory budget (the same
for every stage) as far as the step time stays within (1 + ε) of the best — read off the DP tables
without solving again — and takes the least memory over all candidates. Every answer is
re-evaluated by the cost model as a whole plan.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from parplan.solver.calibration import Calibration
from parplan.solver.cluster import Cluster
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.pipeline import blocks_of, even_partition, in_flight_microbatches, stage_of_units, units_of
from parplan.solver.cost.plan_evaluator import (
    LayerPlan,
    LayerStrategy,
    PlanEvaluator,
    model_states,
    pipeline_seconds,
    stage_extra_temporary_bytes,
    unit_temporary_bytes,
)
from parplan.solver.cost.precision import get_precision
from parplan.solver.cost.rules import search_recomputes
from parplan.solver.cost.unit_strategy import UnitStrategy
from parplan.solver.cost.units import GraphCosts, ParamGroup
from parplan.solver.dp.dynamic import StageSolution, solve_stage_keyed
from parplan.solver.dp.partition import (
    balanced_partition,
    interpolate,
    microbatch_counts,
    pipeline_degrees,
    undominated,
)
from parplan.solver.dp.space import SpaceOptions, context_degrees, degrees, layer_strategies
from parplan.solver.dp.tables import Candidate, StageTables, UnitRow
from parplan.solver.errors import SolverError, StrategyError
from parplan.solver.ir import Graph
from parplan.solver.objective import Objective
from parplan.solver.progress import ProgressFn
from parplan.solver.strategy import Schedule, SplitDims, check_context_parallel

#: Memory granularity of the DP: the budget is cut into this many units.
MEMORY_UNITS = 512


class DpSearch:
    """One model on one cluster: caches graphs and block costs across the candidates."""

    def __init__(self, graph_for: Callable[[int], Graph], cluster: Cluster, global_batch: int, calibration: Calibration,
                 budget_bytes: float, options: SpaceOptions | None = None, precision: str = "bf16",
                 flash_attention: bool = True, graph_costs: Callable[[int], GraphCosts] | None = None,
                 micro_batch: int | None = None) -> None:
        self.graph_for = graph_for
        self.micro_batch = micro_batch  # when given, each block's dp is global_batch / (micro_batch x m)
        self._graph_costs = graph_costs  # where the graphs' costs come from (shared with the caller)
        self._graphs: dict[int, GraphCosts] = {}
        self.cluster = cluster
        self.B = global_batch
        self.calibration = calibration
        self.budget = budget_bytes
        self.options = options or SpaceOptions(max_tp=cluster.gpus_per_node)
        self.prec = get_precision(precision)
        self.flash = flash_attention
        self.ev = PlanEvaluator(self.costs_for, cluster, calibration)
        #: the recomputations offered (the lighter first) for the runtime that prices the probe plans
        self.light, *self.heavier = search_recomputes(self.probe_plan(1, 1).runtime, flash_attention)
        probe = self.costs_for(1)
        self.blocks = blocks_of(probe.graph)
        self.units = units_of(probe.graph)
        self._block_set = set(self.blocks)
        #: experts per MoE layer (0: a dense model); an expert-parallel degree must divide it
        self.experts = max((size for n in probe.graph.nodes for d, size in n.dims if d == "expert"), default=0)
        self.moe = self.experts > 0
        self.splits = SplitDims.of(probe.graph)  # the rule every strategy offered obeys
        self.evaluations = 0
        self.seq_len = int(probe.graph.meta.get("seq_len", 0) or 0)
        self._cp_allowed: dict[tuple[int, int, str], bool] = {}
        self._rows: dict[tuple[int, int, str, bool, tuple[int, int]], UnitRow] = {}
        # a stage's tables depend on its units, its in-flight micro-batches, pp and m only (not on
        # where the other stages cut), so partitions sharing a stage share its tables and DP
        self._tables: dict[tuple[int, int, tuple[str, ...], float, tuple[int, int]], StageTables] = {}
        self._solved: dict[tuple[Any, ...], tuple[StageSolution, float, int] | None] = {}
        self._minima: dict[tuple[int, int, tuple[int, int]], dict[str, tuple[float, float]]] = {}
        self.work = {"stage_tables": 0, "stage_solves": 0, "unit_rows": 0, "candidates_pruned": 0, "groups_pruned": 0}

    def costs_for(self, batch: int) -> GraphCosts:
        if batch not in self._graphs:
            self._graphs[batch] = (self._graph_costs(batch) if self._graph_costs is not None
                                   else GraphCosts(self.graph_for(batch)))
        return self._graphs[batch]

    # ------------------------------------------------------------------ pricing
    def probe_plan(self, pp: int, m: int, partition: tuple[int, ...] | None = None) -> LayerPlan:
        return LayerPlan(pp=pp, num_microbatches=m, global_batch=self.B, layers={}, partition=partition,
                          flash_attention=self.flash, precision=self.prec.name)

    def context_degrees(self, pp: int) -> list[int]:
        """CP degrees to try with ``pp`` stages: 1 alone unless the model can be context-parallel."""
        if self.options.max_cp <= 1:
            return [1]
        try:
            check_context_parallel(self.costs_for(1).graph, 2)
        except StrategyError:
            return [1]
        return context_degrees(self.cluster.num_devices // pp, self.seq_len, self.options)

    def strategies(self, pp: int, m: int, cp: int = 1) -> list[LayerStrategy]:
        n = self.cluster.num_devices // pp
        opts = self.options
        if self.moe and opts.expert_parallel == (1,):
            eps = tuple(e for e in degrees(n // cp) if self.experts % e == 0)
            opts = dataclasses.replace(opts, expert_parallel=eps)
        out = []
        for s in layer_strategies(n, opts, self.moe, cp, self.light, self.splits, tuple(self.heavier)):
            if (self.B % (m * s.dp) or (s.cp_comm != "p2p" and not self.allows(s))
                    or self.micro_batch not in (None, self.B // (m * s.dp))):
                continue
            out.append(s)
        return out

    def allows(self, s: LayerStrategy) -> bool:
        """Whether the model allows ``s``'s context parallelism (the all-to-all splits heads over tp x cp)."""
        key = (s.tp, s.cp, s.cp_comm)
        if key not in self._cp_allowed:
            try:
                check_context_parallel(self.costs_for(1).graph, s.cp, s.cp_comm, s.tp)
                self._cp_allowed[key] = True
            except StrategyError:
                self._cp_allowed[key] = False
        return self._cp_allowed[key]

    def row(self, pp: int, m: int, unit: str, strats: list[LayerStrategy]) -> UnitRow:
        """Costs of ``unit`` under every strategy (cached per representative unit)."""
        probe = self.costs_for(1)
        key = (pp, m, probe.representative[unit], unit in self._block_set, space_key(strats))
        cached = self._rows.get(key)
        if cached is not None:
            return cached
        plan = self.probe_plan(pp, m)
        n = len(strats)
        r = UnitRow(*(np.zeros(n) for _ in range(9)))
        for j, s in enumerate(strats):
            c = self.ev.unit_cost(plan, unit, s, self.prec, timed=True)
            states = model_states(c.params, s, self.prec)
            _, exposed = self.ev.once_per_step(plan, c, s, self.prec, set(), shared=False)
            mb = (c.forward_seconds + c.backward_seconds + c.recompute_seconds + c.tp_comm_seconds + c.cp_comm_seconds
                  + c.ep_comm_seconds)
            r.time[j] = m * mb + exposed + self.ev.optimizer_seconds(states.bytes)
            r.microbatch[j] = mb
            r.states[j] = states.bytes.total
            r.act[j] = c.act_bytes
            gc, us = self.costs_for(plan.local_batch(s)), s.unit(self.flash, plan.runtime)
            dp = plan.runtime.data_parallel(s.tp, s.data_ranks, s.zero)
            r.temp[j] = unit_temporary_bytes(c, s, self.prec, unit in self._block_set,
                                             gc.backward_profile(unit, us, self.prec),
                                             gc.forward_transient(unit, us, self.prec), dp)
            if unit in self._block_set and dp.gathers and dp.gather_buffer:
                r.gather_buffer[j] = c.param_gathered_bytes
            r.root[j] = 0.0 if unit in self._block_set else c.param_elems_all
            r.largest[j] = c.largest_param_elems
            if unit in self._block_set:
                r.relayout[j] = m * self.ev.relayout_seconds(plan, unit, s, self.prec)
        self._rows[key] = r
        self.work["unit_rows"] += 1
        return r

    def stage_units(self, pp: int, partition: tuple[int, ...], stage: int) -> tuple[str, ...]:
        """The units of ``stage`` in forward order."""
        unit_stage = stage_of_units(self.costs_for(1).graph, pp, partition)
        return tuple(u for u in self.units if unit_stage.get(u, 0) == stage)

    def tables(self, pp: int, m: int, partition: tuple[int, ...], stage: int,
               strats: list[LayerStrategy]) -> StageTables:
        """The stage's tables (kept per stage units and in-flight count: see :meth:`stage_tables`)."""
        units = self.stage_units(pp, partition, stage)
        flight = in_flight_microbatches(stage, pp, m, Schedule.ONE_F_ONE_B)
        key = (pp, m, units, flight, space_key(strats))
        tb = self._tables.get(key)
        if tb is None:
            tb = self._tables[key] = self.stage_tables(pp, m, list(units), flight, strats)
        return tb

    def stage_tables(self, pp: int, m: int, units: list[str], flight: float,
                     strats: list[LayerStrategy]) -> StageTables:
        """Per-block costs of a stage of ``units`` holding ``flight`` micro-batches in flight, under
        every strategy (priced afresh; :meth:`tables` keeps them)."""
        self.work["stage_tables"] += 1
        plan = self.probe_plan(pp, m)
        blocks = [u for u in units if u in self._block_set]
        n_l, n_s = len(blocks), len(strats)
        t, per_mb, mem, temp = (np.zeros((n_l, n_s)) for _ in range(4))
        row_of = {b: i for i, b in enumerate(blocks)}
        current = 0
        root = np.zeros(n_s)
        largest = np.zeros(n_s)
        buffer = np.zeros(n_s)  # the last block's gather buffer, alive through the forward of the units after it
        for u in units:  # non-block units are priced with the block before them (or the first)
            current = row_of.get(u, current)
            r = self.row(pp, m, u, strats)
            t[current] += r.time
            per_mb[current] += r.microbatch
            mem[current] += r.states + r.act * flight
            temp[current] = np.maximum(temp[current], r.temp if u in row_of else r.temp + buffer)
            if u in row_of:
                buffer = r.gather_buffer
            root += r.root
            largest = np.maximum(largest, r.largest)
        pieces: dict[tuple[int, UnitStrategy], tuple[dict[ParamGroup, float], float, float, float]] = {}
        for j, s in enumerate(strats):  # parameters and buffers several units share: with the first block
            batch = plan.local_batch(s)
            gc = self.costs_for(batch)
            us = s.unit(self.flash)
            if (batch, us) not in pieces:  # what the stage's units share depends on the batch and us only
                pieces[(batch, us)] = (gc.shared_param_elems(units, us), gc.tied_within(units, us),
                                       gc.tied_gradient_workspace(units, us),
                                       gc.shared_item_bytes(units, us, self.prec.activation_bytes, self.prec.te_fp8)[0])
            shared, tied_within, tied_workspace, shared_items = pieces[(batch, us)]
            always, tied_peak, optimizer = stage_extra_temporary_bytes(
                float(root[j]), tied_within, tied_workspace, float(largest[j]), s.zero >= 3, self.prec)
            held = plan.runtime.held_through_step_bytes  # workspaces, buckets: the whole step, as the walk adds them
            temp[:, j] = np.maximum(temp[:, j] + always, max(tied_peak, optimizer)) + held
            if shared:
                st = model_states(shared, s, self.prec)
                synced: set[str] = set()
                # only units using a shared parameter sync any (the others add exactly 0.0)
                exposed = sum(self.ev.once_per_step(plan, self.ev.unit_cost(plan, u, s, self.prec, timed=True), s,
                                                    self.prec, synced, own=False)[1] for u in gc.sharing(units))
                t[0, j] += exposed + self.ev.optimizer_seconds(st.bytes)
                mem[0, j] += st.bytes.total
            mem[0, j] += shared_items * flight
        relayout = np.array([self.row(pp, m, b, strats).relayout for b in blocks[1:]]).reshape(max(n_l - 1, 0), n_s)
        layout_ids: dict[tuple[int, ...], int] = {}
        keys = [layout_ids.setdefault(s.layout_key, len(layout_ids)) for s in strats]
        return StageTables(blocks, t, mem, temp, relayout, keys, per_mb)

    def unit_minima(self, pp: int, m: int, strats: list[LayerStrategy]) -> dict[str, tuple[float, float]]:
        """Per unit: its least seconds per micro-batch and, apart, its least seconds once per step
        over the strategies (from its row)."""
        key = (pp, m, space_key(strats))
        kept = self._minima.get(key)
        if kept is None:
            kept = {}
            for u in self.units:
                r = self.row(pp, m, u, strats)
                kept[u] = (float(r.microbatch.min()), float((r.time - m * r.microbatch).min()))
            self._minima[key] = kept
        return kept

    def group_bound(self, pp: int, m: int, strats: list[LayerStrategy]) -> float:
        """A lower bound on the step seconds of any plan with ``pp`` stages and ``m`` micro-batches:
        every unit at its fastest per micro-batch and, apart, at its least once per step, spread as
        evenly as can be over a 1F1B pipeline, bubble included (no re-layout). The 1F1B step time
        (:func:`pipeline_seconds`) grows with every stage's seconds, so lower bounds on those give
        a lower bound on the step."""
        minima = self.unit_minima(pp, m, strats).values()
        per_mb = sum(a for a, _ in minima)
        once = sum(b for _, b in minima)
        return pipeline_seconds([per_mb / pp] * pp, [once / pp], m, 1)

    def bounds(self, pp: int, m: int, partition: tuple[int, ...], strats: list[LayerStrategy]) -> float:
        """A lower bound on the step seconds of any plan of the candidate: each stage's units at
        their fastest per micro-batch and, apart, at their least once per step, as a 1F1B pipeline
        (no re-layout, no shared parameter's synchronisation)."""
        minima = self.unit_minima(pp, m, strats)
        per_mb, once = [0.0] * pp, [0.0] * pp
        unit_stage = stage_of_units(self.costs_for(1).graph, pp, partition)
        for u in self.units:
            stage = unit_stage.get(u, 0)
            per_mb[stage] += minima[u][0]
            once[stage] += minima[u][1]
        return pipeline_seconds(per_mb, once, m, 1)

    def solve_candidate(self, pp: int, m: int, partition: tuple[int, ...],
                        strats: list[LayerStrategy]) -> Candidate | None:
        """Per-stage DPs under the budget; None when some stage cannot fit."""
        cand = Candidate(pp, m, partition, strategies=strats)
        unit = self.budget / MEMORY_UNITS
        for stage in range(pp):
            tb = self.tables(pp, m, partition, stage, strats)
            self.evaluations += tb.mem.size
            key = (id(tb), unit)
            if key not in self._solved:
                self._solved[key] = self.solve_stage(tb, unit)
            best = self._solved[key]
            if best is None:
                return None
            cand.solutions.append(best)
        return cand

    def solve_stage(self, tb: StageTables, unit: float) -> tuple[StageSolution, float, int] | None:
        """A stage's DP under the budget: the best of three reservations for temporary buffers."""
        best: tuple[StageSolution, float, int] | None = None
        best_time = math.inf
        temps = sorted({float(x) for x in np.unique(tb.temp)}, reverse=True)
        for tau in dict.fromkeys([temps[0], temps[len(temps) // 2], temps[-1]]):
            # strategies whose temporary buffers exceed tau are left out; tau is reserved
            allowed = tb.temp <= tau + 1e-9
            mem_units = np.where(allowed, np.ceil(tb.mem / unit), MEMORY_UNITS + 1).astype(np.int64)
            tau_units = math.ceil(tau / unit)
            budget_units = MEMORY_UNITS - tau_units
            if budget_units < 0:
                continue
            self.work["stage_solves"] += 1
            sol = solve_stage_keyed(tb.time, mem_units, tb.keys, tb.relayout, budget_units)
            t = float(sol.best_by_budget[budget_units])
            if t < best_time:
                best_time, best = t, (sol, unit, tau_units)
        return best

    # ------------------------------------------------------------------ reading answers
    def plan_at(self, cand: Candidate, budget_units: int) -> LayerPlan | None:
        """The candidate's plan when every stage may use ``budget_units`` (temporary included)."""
        layers: dict[str, LayerStrategy] = {}
        first = 0
        for stage, (sol, _, tau_units) in enumerate(cand.solutions):
            choice = sol.choices(budget_units - tau_units) if budget_units >= tau_units else None
            if choice is None:
                return None
            blocks = self.blocks[first:first + cand.partition[stage]]
            first += cand.partition[stage]
            layers.update({b: cand.strategies[c] for b, c in zip(blocks, choice, strict=True)})
        return LayerPlan(pp=cand.pp, num_microbatches=cand.m, global_batch=self.B, layers=layers,
                          partition=cand.partition, flash_attention=self.flash, precision=self.prec.name)

    def predicted(self, cand: Candidate, budget_units: int) -> float:
        """The DP's per-stage least times at a budget, combined as a pipeline (inf if infeasible)."""
        times = []
        for sol, _, tau_units in cand.solutions:
            e = budget_units - tau_units
            times.append(float(sol.best_by_budget[e]) if e >= 0 else math.inf)
        return max(times) if times else math.inf

    # ------------------------------------------------------------------ partitions
    def layer_weights(self, pp: int, m: int, strats: list[LayerStrategy]) -> tuple[list[float], list[float]]:
        """Per block: its least memory (one micro-batch in flight) and least time over the strategies,
        priced where the even split puts it (so the embedding and the LM head weigh on the blocks
        beside them)."""
        even = even_partition(len(self.blocks), pp)
        mem: dict[str, float] = {}
        t: dict[str, float] = {}
        for stage in range(pp):
            tb = self.tables(pp, m, even, stage, strats)
            flight = in_flight_microbatches(stage, pp, m, Schedule.ONE_F_ONE_B)
            for i, b in enumerate(tb.blocks):
                mem[b] = float(tb.mem[i].min()) / max(flight, 1.0)
                t[b] = float(tb.time[i].min())
        return [mem[b] for b in self.blocks], [t[b] for b in self.blocks]

    def partitions(self, pp: int, m: int, strats: list[LayerStrategy]) -> list[tuple[int, ...]]:
        """Memory-balanced, then steps towards time-balanced, and the even split."""
        if pp == 1:
            return [(len(self.blocks),)]
        mem_w, time_w = self.layer_weights(pp, m, strats)
        flight = [in_flight_microbatches(i, pp, m, Schedule.ONE_F_ONE_B) for i in range(pp)]
        mem_part = balanced_partition(mem_w, pp, lambda stage, w: w * (flight[stage] / flight[0]))
        time_part = balanced_partition(time_w, pp, lambda stage, w: w)
        out = [mem_part]
        for alpha in (0.25, 0.5, 0.75, 1.0):
            out.append(interpolate(mem_part, time_part, alpha))
        out.append(even_partition(len(self.blocks), pp))
        return list(dict.fromkeys(out))


def space_key(strats: list[LayerStrategy]) -> tuple[int, int]:
    """What tells the strategy lists of one pipeline degree and micro-batch count apart: their
    length and their context-parallel degree (every strategy of a list shares it)."""
    return len(strats), strats[0].cp if strats else 1


def search(graph_for: Callable[[int], Graph], cluster: Cluster, *, global_batch: int, objective: str,
           budget_bytes: float, max_slowdown: float, alpha_gib_per_s: float | None, calibration: Calibration,
           reference: LayerPlan | None = None, options: SpaceOptions | None = None,
           timeout_seconds: float = 60.0, progress: ProgressFn | None = None,
           pareto: bool = False, pp_choices: list[int] | None = None,
           m_choices: list[int] | None = None, prune: bool = True,
           graph_costs: Callable[[int], GraphCosts] | None = None, precision: str = "bf16",
           micro_batch: int | None = None) -> DpOutcome:
    """Run the search (see the module docstring).

    ``pp_choices`` / ``m_choices`` restrict the pipeline degrees and micro-batch counts tried.
    Unless ``pareto``, a group (pipeline degree, micro-batches) or a candidate partition is not
    solved when a lower bound on its step time (:meth:`DpSearch.group_bound`,
    :meth:`DpSearch.bounds`) shows that none of its plans can be the answer (``prune=False``: every
    candidate is solved); under ``pareto`` every candidate is solved and its whole ladder walked.
    ``graph_costs`` gives each micro-batch's graph costs (default: built from ``graph_for``), so a
    caller pricing the same graphs (the planner's baselines) shares their unit prices."""
    t0 = time.perf_counter()
    report = progress or (lambda stage, fraction: None)
    goal = Objective.of(objective, max_slowdown, alpha_gib_per_s)
    ds = DpSearch(graph_for, cluster, global_batch, calibration, budget_bytes, options, precision=precision,
                  graph_costs=graph_costs, micro_batch=micro_batch)

    def evaluate(plan: LayerPlan) -> tuple[float, float]:
        mem = ds.ev.memory(plan)
        return ds.ev.time(plan).step_seconds, mem.peak_bytes

    fastest = math.inf  # seconds of the fastest plan evaluated so far that fits: it rules out the slower

    def note(plan: LayerPlan) -> None:
        nonlocal fastest
        secs, peak = evaluate(plan)
        if peak <= budget_bytes:
            fastest = min(fastest, secs)

    if reference is not None:
        note(reference)
    cands: list[Candidate] = []
    ladders: list[list[tuple[float, float, LayerPlan]]] = []  # per candidate, under ``pareto``
    groups = _groups(ds, pp_choices, m_choices)
    for i, (group_secs, pp, m, strats) in enumerate(groups):
        if time.perf_counter() - t0 > timeout_seconds:
            raise SolverError(f"the DP search ran out of its {timeout_seconds:g} s time limit; raise the limit")
        report("search", 0.05 + 0.8 * i / len(groups))
        if prune and not pareto and goal.cannot_matter(group_secs, fastest):
            ds.work["groups_pruned"] += 1
            continue
        for part in ds.partitions(pp, m, strats):
            lb_secs = ds.bounds(pp, m, part, strats)
            if prune and not pareto and goal.cannot_matter(lb_secs, fastest):
                ds.work["candidates_pruned"] += 1
                continue
            try:
                cand = ds.solve_candidate(pp, m, part, strats)
            except StrategyError:
                continue  # some strategy does not apply to a stage of this split
            if cand is None:
                break  # moving further towards time balance would not fit either
            cands.append(cand)
            top = ds.plan_at(cand, MEMORY_UNITS)
            if top is not None:
                note(top)
            if pareto:
                ladders.append(_ladder_points(ds, cand, evaluate, None))
    report("choosing", 0.9)
    evaluated: list[tuple[float, float, LayerPlan]] = []  # (step seconds, peak bytes, plan)
    for cand in cands:
        plan = ds.plan_at(cand, MEMORY_UNITS)
        if plan is not None:
            secs, peak = evaluate(plan)
            if peak <= budget_bytes:
                evaluated.append((secs, peak, plan))
    if reference is not None:
        secs, peak = evaluate(reference)
        if peak <= budget_bytes:
            evaluated.append((secs, peak, reference))
    if not evaluated:
        least = _least_memory(ds, cands)
        return DpOutcome("infeasible", time.perf_counter() - t0, ds.ev, len(cands), work(ds, cands), least=least)
    return _chosen(ds, goal, cands, evaluated, ladders, pareto, evaluate, t0)


def _groups(ds: DpSearch, pp_choices: list[int] | None,
            m_choices: list[int] | None) -> list[tuple[float, int, int, list[LayerStrategy]]]:
    """Every (pipeline degree, micro-batch count) with its strategies and a bound on its step
    seconds, the fastest bounds first: their plans are the ones that prune the rest."""
    groups = []  # (bound on step seconds, pp, micro-batches, strategies)
    for pp in pp_choices or pipeline_degrees(ds.cluster.num_devices, len(ds.blocks)):
        for cp in ds.context_degrees(pp):
            for m in m_choices or microbatch_counts(ds.B, pp, ds.micro_batch, ds.cluster.num_devices // pp):
                strats = ds.strategies(pp, m, cp)
                if strats:
                    groups.append((ds.group_bound(pp, m, strats), pp, m, strats))
    groups.sort(key=lambda g: g[0])
    return groups


def _chosen(ds: DpSearch, goal: Objective, cands: list[Candidate], evaluated: list[tuple[float, float, LayerPlan]],
            ladders: list[list[tuple[float, float, LayerPlan]]], pareto: bool,
            evaluate: Callable[[LayerPlan], tuple[float, float]], t0: float) -> DpOutcome:
    """The answer for the objective among the candidates' fastest plans (``evaluated``, all fitting)
    and, under ``min-memory`` or ``pareto``, their budget ladders; and the frontier it was chosen on."""
    best_secs = min(x[0] for x in evaluated)
    chosen = goal.best(evaluated, _seconds, _peak, best_secs) if goal.kind == "max-throughput" else None
    frontier = undominated(evaluated)  # max-throughput, no pareto: of the candidates' fastest plans
    if goal.kind == "min-memory" or pareto:
        # each ladder down to the first plan past the allowed slowdown (with alpha too), or whole
        limit = goal.slowdown_limit(best_secs)
        if not pareto:
            ladders = [_ladder_points(ds, cand, evaluate, limit) for cand in cands]
        pool = evaluated + [x for ladder in ladders for x in ladder]
        if goal.kind == "min-memory":
            chosen = goal.best(pool, _seconds, _peak, best_secs)
        frontier = undominated(pool)
    assert chosen is not None  # the fastest plan meets every limit
    return DpOutcome("optimal", time.perf_counter() - t0, ds.ev, len(cands), work(ds, cands), plan=chosen[2],
                     step_seconds=chosen[0], peak_bytes=chosen[1], best_seconds=best_secs, frontier=tuple(frontier))


@dataclass(frozen=True)
class DpOutcome:
    """What the DP search found: the chosen plan (None when nothing fits; then ``least``, the least
    memory any assignment needs, bytes), its step seconds and peak bytes, the fastest plan's
    seconds (``best_seconds``), the memory vs time frontier (step seconds, peak bytes, plan), the
    search's wall-clock seconds, the evaluator that priced the plans and the work counted."""

    status: str
    seconds: float
    evaluator: PlanEvaluator
    candidates: int
    work: dict[str, int]
    plan: LayerPlan | None = None
    step_seconds: float = 0.0
    peak_bytes: float = 0.0
    best_seconds: float = 0.0
    frontier: tuple[tuple[float, float, LayerPlan], ...] = ()
    least: float | None = None


def work(ds: DpSearch, cands: list[Candidate]) -> dict[str, int]:
    """What the search did, counted (deterministic for fixed inputs): candidates kept, stage tables
    built, stage DPs solved, distinct unit rows (a unit's costs under every strategy), distinct unit
    costs priced, and whole-plan evaluations (memory and time, each counted) computed and asked for."""
    ev = ds.ev.work
    return {"candidates": len(cands), "stage_tables": ds.work["stage_tables"],
            "stage_solves": ds.work["stage_solves"], "unit_rows": ds.work["unit_rows"],
            "candidates_pruned": ds.work["candidates_pruned"], "groups_pruned": ds.work["groups_pruned"],
            "unit_pricings": sum(gc.pricings for gc in ds._graphs.values()),
            "plan_evaluations": ev["plan_memory_evaluations"] + ev["plan_time_evaluations"],
            "plan_evaluation_requests": ev["plan_memory_requests"] + ev["plan_time_requests"]}


def _seconds(point: tuple[float, float, LayerPlan]) -> float:
    return point[0]


def _peak(point: tuple[float, float, LayerPlan]) -> float:
    return point[1]


def _ladder_points(ds: DpSearch, cand: Candidate, evaluate: Callable[[LayerPlan], tuple[float, float]],
                   limit: float | None) -> list[tuple[float, float, LayerPlan]]:
    """The candidate's plans down its budget ladder, evaluated (step seconds, peak bytes, plan);
    with ``limit`` (seconds) the walk stops at the first plan slower than it."""
    out: list[tuple[float, float, LayerPlan]] = []
    for e in _budget_ladder(ds, cand):
        plan = ds.plan_at(cand, e)
        if plan is None:
            break
        secs, peak = evaluate(plan)
        out.append((secs, peak, plan))
        if limit is not None and secs > limit:
            break
    return out


def _budget_ladder(ds: DpSearch, cand: Candidate) -> list[int]:
    """Budgets (memory units) from the full one downwards where some stage's least time changes."""
    steps: set[int] = set()
    for sol, _, tau_units in cand.solutions:
        b = sol.best_by_budget
        finite = np.isfinite(b)
        changes = np.nonzero(finite[1:] & (b[1:] != b[:-1]))[0] + 1
        steps.update(int(x) + tau_units for x in changes)
    return sorted((x for x in steps if x <= MEMORY_UNITS), reverse=True)[:24]


def _least_memory(ds: DpSearch, cands: list[Candidate]) -> float | None:
    """The least per-device memory of any strategy assignment: every block at its leanest."""
    least = math.inf
    for pp in pipeline_degrees(ds.cluster.num_devices, len(ds.blocks)):
        counts = microbatch_counts(ds.B, pp, ds.micro_batch, ds.cluster.num_devices // pp)
        for m, cp in itertools.product(counts if ds.micro_batch else counts[-1:], ds.context_degrees(pp)):
            strats = ds.strategies(pp, m, cp)
            if not strats:
                continue
            part = even_partition(len(ds.blocks), pp)
            stages = [ds.tables(pp, m, part, stage, strats) for stage in range(pp)]
            least = min(least, max(float(tb.mem.min(axis=1).sum() + tb.temp.min()) for tb in stages))
    return least if math.isfinite(least) else None


__all__ = ["GraphCosts", "Recompute", "balanced_partition", "microbatch_counts", "pipeline_degrees", "search"]

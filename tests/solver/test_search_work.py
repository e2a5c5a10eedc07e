"""The DP search counts its work, and its caches give what fresh pricing gives.

Work counts (``res.work``, the plan document's ``solver.work``) are deterministic for fixed
inputs; the bounds here are about 1.5x the counts measured when they were set (written beside
each), so a change that multiplies the search's work fails. The caches are checked against
oracles computed afresh: a stage's kept tables against tables priced again, and every plan the
search evaluates against an evaluator that caches nothing."""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parplan.solver.calibration import DEFAULT_CALIBRATION
from parplan.solver.cluster import Cluster, make_cluster
from parplan.solver.cost.pipeline import blocks_of, in_flight_microbatches
from parplan.solver.cost.plan_evaluator import LayerPlan, PlanEvaluator
from parplan.solver.cost.runtime import Runtime
from parplan.solver.cost.units import GraphCosts
from parplan.solver.dp.dynamic import solve_stage_keyed
from parplan.solver.dp.search import DpSearch, balanced_partition, search
from parplan.solver.errors import SolverError
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.frontends.presets import get_preset
from parplan.solver.ir import Graph
from parplan.solver.planner import solve
from parplan.solver.request import parse_plan_request
from parplan.solver.strategy import Schedule

GIB = 2**30


def _run(cfg: TransformerConfig, cluster: Cluster, global_batch: int, objective: str = "max-throughput",
         pareto: bool = True, pp_choices: list[int] | None = None) -> dict[str, object]:
    return search(lambda b: build_graph(cfg, batch=b), cluster, global_batch=global_batch, objective=objective,
                  budget_bytes=cluster.device_memory_bytes, max_slowdown=0.1, alpha_gib_per_s=None,
                  calibration=DEFAULT_CALIBRATION, timeout_seconds=600, pareto=pareto, pp_choices=pp_choices)


def _small_moe() -> TransformerConfig:
    return get_preset("mixtral-8x7b").with_(layers=4, hidden=512, heads=8, kv_heads=4, ffn=1024, vocab=1024,
                                            seq_len=256)


# (name, model, gpus, gpu, pipeline degrees, bounds): one sample per GPU, the planner's Pareto ladder on
CASES: list[tuple[str, Callable[[], TransformerConfig], int, str, list[int] | None, dict[str, int]]] = [
    ("gpt-7.5b@64", lambda: get_preset("gpt-7.5b"), 64, "A100-80GB", None,
     # measured: candidates 70, stage_tables 521, stage_solves 1335, unit_rows 105, unit_pricings 276,
     # plan_evaluations 2270 (of 2410 asked for)
     {"candidates": 105, "stage_tables": 780, "stage_solves": 2000, "unit_rows": 160, "unit_pricings": 415,
      "plan_evaluations": 3400}),
    ("llama-2-70b@1024-pp8,16", lambda: get_preset("llama-2-70b"), 1024, "H100-80GB", [8, 16],
     # measured: candidates 40, stage_tables 459, stage_solves 1377, unit_rows 40, unit_pricings 232,
     # plan_evaluations 1876 (of 1954)
     {"candidates": 60, "stage_tables": 690, "stage_solves": 2070, "unit_rows": 60, "unit_pricings": 350,
      "plan_evaluations": 2820}),
    ("small-moe@8", _small_moe, 8, "A100-80GB", None,
     # measured: candidates 9, stage_tables 18, stage_solves 41, unit_rows 45, unit_pricings 240,
     # plan_evaluations 18 (of 36)
     {"candidates": 14, "stage_tables": 27, "stage_solves": 62, "unit_rows": 68, "unit_pricings": 360,
      "plan_evaluations": 27}),
]


@pytest.mark.parametrize(("name", "model", "gpus", "gpu", "pp", "bounds"), CASES, ids=[c[0] for c in CASES])
def test_dp_search_work_stays_bounded(name: str, model: Callable[[], TransformerConfig], gpus: int, gpu: str,
                                      pp: list[int] | None, bounds: dict[str, int]) -> None:
    res = _run(model(), make_cluster(gpus, 8, gpu), gpus, pp_choices=pp)
    assert res.status == "optimal"
    work = res.work
    assert isinstance(work, dict)
    for key, bound in bounds.items():
        assert work[key] <= bound, f"{name}: {key} = {work[key]} > {bound}"
    assert work["plan_evaluations"] <= work["plan_evaluation_requests"]


def test_the_plan_document_carries_the_work() -> None:
    body = {"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": 16, "gpus_per_node": 8},
            "training": {"global_batch": 64, "seq_len": 1024}, "objective": {"kind": "max-throughput"},
            "search": "dp"}
    doc = solve(parse_plan_request(body))
    work = doc["solver"]["work"]
    assert {"candidates", "stage_tables", "stage_solves", "unit_pricings", "plan_evaluations",
            "baseline_evaluations"} <= set(work)
    assert all(isinstance(v, int) and v >= 0 for v in work.values())
    assert work == solve(parse_plan_request(body))["solver"]["work"], "deterministic"


def _search_and_oracle(cfg: TransformerConfig, gpus: int, batch: int) -> tuple[DpSearch, Callable[[int], GraphCosts]]:
    cluster = make_cluster(gpus, 8, "A100-80GB")
    ds = DpSearch(lambda b: build_graph(cfg, batch=b), cluster, batch, DEFAULT_CALIBRATION, 80 * GIB)
    graphs: dict[int, GraphCosts] = {}

    def fresh(b: int) -> GraphCosts:
        return graphs.setdefault(b, GraphCosts(build_graph(cfg, batch=b)))

    return ds, fresh


def test_kept_stage_tables_equal_tables_priced_afresh() -> None:
    """Partitions share stages; the kept tables of a stage equal a fresh search's for that stage."""
    cfg = TransformerConfig("gpt", "tiny", 8, 256, 8, 1024, 4096, 256)
    ds, _ = _search_and_oracle(cfg, 8, 32)
    for pp, m in ((2, 4), (4, 8)):
        strats = ds.strategies(pp, m)
        for part in ds.partitions(pp, m, strats):
            for stage in range(pp):
                kept = ds.tables(pp, m, part, stage, strats)
                again = DpSearch(ds.graph_for, ds.cluster, ds.B, DEFAULT_CALIBRATION, 80 * GIB)
                fresh = again.stage_tables(pp, m, list(again.stage_units(pp, part, stage)),
                                           in_flight_microbatches(stage, pp, m, Schedule.ONE_F_ONE_B), strats)
                assert kept.blocks == fresh.blocks
                assert kept.keys == fresh.keys
                for a, b in ((kept.time, fresh.time), (kept.mem, fresh.mem), (kept.temp, fresh.temp),
                             (kept.relayout, fresh.relayout)):
                    assert np.array_equal(a, b)


@pytest.mark.parametrize("model", ["tiny", "moe"])
def test_cached_evaluation_equals_an_evaluator_that_caches_nothing(model: str) -> None:
    """Every plan of a search (candidates and the budget ladder), and random per-layer plans under
    every schedule and runtime, priced by the search's caching evaluator and by a fresh one that
    caches nothing: the same figures, exactly."""
    cfg = TransformerConfig("gpt", "tiny", 6, 256, 8, 1024, 4096, 256) if model == "tiny" else _small_moe()
    cluster = make_cluster(8, 8, "A100-80GB")
    graph_for: Callable[[int], Graph] = lambda b: build_graph(cfg, batch=b)  # noqa: E731
    res = search(graph_for, cluster, global_batch=32, objective="min-memory", budget_bytes=80 * GIB,
                 max_slowdown=0.1, alpha_gib_per_s=None, calibration=DEFAULT_CALIBRATION, pareto=True)
    ev = res.evaluator
    assert isinstance(ev, PlanEvaluator)
    graphs: dict[int, GraphCosts] = {}
    oracle = PlanEvaluator(lambda b: graphs.setdefault(b, GraphCosts(graph_for(b))), cluster, DEFAULT_CALIBRATION,
                           cache=False)
    plans = [p for _, _, p in res.frontier] + [res.plan]
    rng = random.Random(3)
    blocks = blocks_of(graph_for(1))
    ds = DpSearch(graph_for, cluster, 32, DEFAULT_CALIBRATION, 80 * GIB)
    for _ in range(40):
        pp = rng.choice([1, 2, 3])
        m = rng.choice([1, 2, 4])
        strats = ds.strategies(pp, m) if 8 % pp == 0 else []
        if not strats:
            continue
        sched = rng.choice([Schedule.ONE_F_ONE_B, Schedule.GPIPE, Schedule.INTERLEAVED]) if pp > 1 else \
            Schedule.ONE_F_ONE_B
        plans.append(LayerPlan(pp=pp, num_microbatches=m, global_batch=32,
                               layers={b: rng.choice(strats) for b in blocks}, schedule=sched,
                               virtual_stages=2 if sched is Schedule.INTERLEAVED else 1,
                               runtime=rng.choice(list(Runtime)), sync_every_microbatch=rng.random() < 0.2))
    priced = 0
    for plan in plans:
        for _ in range(2):  # the second time from the plan cache
            try:
                got = (ev.memory(plan), ev.time(plan))
            except SolverError as e:
                with pytest.raises(SolverError, match=re.escape(str(e))):
                    oracle.memory(plan)
                    oracle.time(plan)
                continue
            assert got == (oracle.memory(plan), oracle.time(plan))
            priced += 1
    assert priced >= 40
    assert ev.work["plan_memory_evaluations"] < ev.work["plan_memory_requests"]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.integers(0, 24), st.integers(0, 2**31 - 1))
def test_leaving_out_strategies_that_never_fit_changes_nothing(layers: int, strategies: int, budget: int,
                                                                seed: int) -> None:
    """The keyed stage DP with the strategies over budget on every layer left out gives the same
    least times and the same choices, at every budget, as the DP over all of them (ties broken the
    same way: times drawn from few values so that they tie)."""
    rng = np.random.default_rng(seed)
    t = rng.integers(0, 4, (layers, strategies)).astype(float)
    mem = rng.integers(0, 12, (layers, strategies))
    mem[:, rng.random(strategies) < 0.4] = budget + 1  # never fits
    keys = [int(k) for k in rng.integers(0, 3, strategies)]
    relayout = rng.integers(0, 3, (max(layers - 1, 0), strategies)).astype(float)
    fast = solve_stage_keyed(t, mem, keys, relayout, budget)
    full = solve_stage_keyed(t, mem, keys, relayout, budget, leave_out_infeasible=False)
    assert np.array_equal(fast.best_by_budget, full.best_by_budget)
    for e in range(budget + 1):
        assert fast.choices(e) == full.choices(e)


def _balanced_partition_loops(weights: list[float], p: int, scale: Callable[[int, float], float]) -> tuple[int, ...]:
    """The partition DP with plain loops (what the vectorised one replaced)."""
    n = len(weights)
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    best = [[math.inf] * (n + 1) for _ in range(p + 1)]
    cut = [[0] * (n + 1) for _ in range(p + 1)]
    best[0][0] = 0.0
    for k in range(1, p + 1):
        for j in range(k, n - (p - k) + 1):
            for i in range(k - 1, j):
                v = max(best[k - 1][i], scale(k - 1, prefix[j] - prefix[i]))
                if v < best[k][j]:
                    best[k][j], cut[k][j] = v, i
    sizes, j = [], n
    for k in range(p, 0, -1):
        i = cut[k][j]
        sizes.append(j - i)
        j = i
    return tuple(reversed(sizes))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0, 7.25]), min_size=1, max_size=24), st.integers(1, 8))
def test_vectorised_partition_equals_the_loops(weights: list[float], p: int) -> None:
    p = min(p, len(weights))
    flight = [float(min(p - i, 4)) for i in range(p)]
    for scale in (lambda stage, w: w, lambda stage, w: w * (flight[stage] / flight[0])):
        assert balanced_partition(weights, p, scale) == _balanced_partition_loops(weights, p, scale)


def _keyed_reference(time: np.ndarray, mem: np.ndarray, keys: list[int], relayout: np.ndarray,
                     budget: int) -> tuple[np.ndarray, list[list[int] | None]]:
    """The keyed stage DP as first written (a loop per key and per strategy, every strategy kept):
    least time and choices at every budget."""
    n_layers, n_strat = time.shape
    width = budget + 1
    key_arr = np.asarray(keys)
    groups = [np.nonzero(key_arr == k)[0] for k in sorted(set(keys))]
    group_of = np.empty(n_strat, dtype=np.int64)
    for gi, members in enumerate(groups):
        group_of[members] = gi
    f = np.full((n_strat, width), np.inf)
    for s in range(n_strat):
        if mem[0, s] <= budget:
            f[s, mem[0, s]:] = time[0, s]
    back = []
    for layer in range(1, n_layers):
        best_all, arg_all = f.min(axis=0), f.argmin(axis=0)
        group_best = np.empty((len(groups), width))
        group_arg = np.empty((len(groups), width), dtype=np.int64)
        for gi, members in enumerate(groups):
            sub = f[members]
            idx = sub.argmin(axis=0)
            group_arg[gi] = members[idx]
            group_best[gi] = sub[idx, np.arange(width)]
        same = group_best[group_of]
        other = best_all[None, :] + relayout[layer - 1][:, None]
        use_other = other < same
        h = np.where(use_other, other, same)
        arg = np.where(use_other, arg_all[None, :], group_arg[group_of])
        g = np.full((n_strat, width), np.inf)
        b = np.zeros((n_strat, width), dtype=np.int64)
        for s in range(n_strat):
            k = int(mem[layer, s])
            if k <= budget:
                g[s, k:] = h[s, : width - k] + time[layer, s]
                b[s, k:] = arg[s, : width - k]
        f = g
        back.append(b)
    out: list[list[int] | None] = []
    for e in range(width):
        s = int(np.argmin(f[:, e]))
        if not np.isfinite(f[s, e]):
            out.append(None)
            continue
        path, budget_left = [s], e
        for layer in range(len(back), 0, -1):
            prev = int(back[layer - 1][s, budget_left])
            budget_left -= int(mem[layer, s])
            s = prev
            path.append(s)
        out.append(path[::-1])
    return f.min(axis=0), out


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), st.integers(1, 7), st.integers(0, 24), st.integers(0, 2**31 - 1))
def test_vectorised_keyed_dp_equals_the_loops(layers: int, strategies: int, budget: int, seed: int) -> None:
    """Same least times and the same choices (ties included: few distinct times) at every budget."""
    rng = np.random.default_rng(seed)
    t = rng.integers(0, 4, (layers, strategies)).astype(float)
    mem = rng.integers(0, 12, (layers, strategies))
    mem[:, rng.random(strategies) < 0.3] = budget + 1
    keys = [int(k) for k in rng.integers(0, 4, strategies)]
    relayout = rng.integers(0, 3, (max(layers - 1, 0), strategies)).astype(float)
    sol = solve_stage_keyed(t, mem, keys, relayout, budget)
    best, choices = _keyed_reference(t, mem, keys, relayout, budget)
    assert np.array_equal(sol.best_by_budget, best)
    assert [sol.choices(e) for e in range(budget + 1)] == choices


@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_alike_middle_stages_priced_once_give_what_each_stage_priced_afresh_gives(family: str) -> None:
    """The evaluator prices a stage's time once for every stage between the first and the last
    made of alike units (:func:`~parplan.solver.cost.price_keys.stage_time_key`): uniform and per-layer plans of
    deep pipelines (1F1B, GPipe, interleaved) priced by it and by an evaluator that caches nothing
    give the same figures, each stage with its own index."""
    cfg = (TransformerConfig("gpt", "tiny", 16, 256, 8, 1024, 4096, 256) if family == "gpt" else
           get_preset("llama-3-8b").with_(layers=16, hidden=256, heads=8, kv_heads=2, ffn=512, vocab=1024,
                                          seq_len=256))
    cluster = make_cluster(16, 8, "A100-80GB")
    graph_for: Callable[[int], Graph] = lambda b: build_graph(cfg, batch=b)  # noqa: E731
    graphs: dict[int, GraphCosts] = {}
    ds = DpSearch(graph_for, cluster, 32, DEFAULT_CALIBRATION, 80 * GIB)
    ev = ds.ev
    oracle = PlanEvaluator(lambda b: graphs.setdefault(b, GraphCosts(graph_for(b))), cluster, DEFAULT_CALIBRATION,
                           cache=False)
    blocks = blocks_of(graph_for(1))
    rng = random.Random(5)
    compared = 0
    for pp in (2, 4, 8):
        strats = ds.strategies(pp, 4)
        assert strats
        for sched, v in ((Schedule.ONE_F_ONE_B, 1), (Schedule.GPIPE, 1), (Schedule.INTERLEAVED, 2)):
            for uniform in (True, False):
                one = rng.choice(strats)
                plan = LayerPlan(pp=pp, num_microbatches=4, global_batch=32,
                                 layers={b: one if uniform else rng.choice(strats) for b in blocks},
                                 schedule=sched, virtual_stages=v)
                try:
                    got = ev.time(plan)
                except SolverError:
                    continue
                want = oracle.time(plan)
                assert got == want
                assert [s.stage for s in got.stages] == list(range(len(got.stages)))
                compared += 1
    assert compared >= 12

"""The Galvatron-BMW search: decision-tree counts, the DP against brute force, partitions,
baselines, heterogeneous layers."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parplan.solver.calibration import DEFAULT_CALIBRATION
from parplan.solver.cluster import make_cluster
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.pipeline import even_partition
from parplan.solver.cost.plan_evaluator import LayerPlan, PlanEvaluator
from parplan.solver.cost.units import GraphCosts
from parplan.solver.dp.dynamic import brute_force_stage, solve_stage, solve_stage_keyed
from parplan.solver.dp.search import DpSearch, balanced_partition, search
from parplan.solver.dp.space import GALVATRON, SpaceOptions, count_strategies, layer_strategies
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.frontends.presets import get_preset
from parplan.solver.planner import solve
from parplan.solver.request import RequestError, parse_plan_request, request_hash

GIB = 2**30


def test_galvatron_counts_22_strategies_on_8_devices_44_with_checkpointing() -> None:
    assert count_strategies(8, GALVATRON) == 22
    with_ckpt = SpaceOptions(zero_stages=(0, 3), checkpointing=True, sequence_parallel="never")
    assert count_strategies(8, with_ckpt) == 44


def test_degrees_use_divisors_when_not_a_power_of_two() -> None:
    tps = {s.tp for s in layer_strategies(6, GALVATRON)}
    assert tps == {1, 2, 3, 6}


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 6), st.integers(1, 4), st.integers(0, 24), st.integers(0, 2**31 - 1))
def test_stage_dp_equals_brute_force(layers: int, strategies: int, budget: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    t = rng.uniform(0, 10, (layers, strategies))
    mem = rng.integers(0, 7, (layers, strategies))
    switch = [rng.uniform(0, 3, (strategies, strategies)) for _ in range(layers - 1)]
    sol = solve_stage(t, mem, switch, budget)
    oracle = brute_force_stage(t, mem, switch, budget)
    got = float(sol.best_by_budget[budget])
    assert (math.isinf(oracle) and math.isinf(got)) or got == pytest.approx(oracle)
    choice = sol.choices(budget)
    if choice is not None:
        assert sum(int(mem[i, s]) for i, s in enumerate(choice)) <= budget
        total = sum(t[i, s] for i, s in enumerate(choice)) + sum(switch[i - 1][choice[i - 1], choice[i]]
                                                                  for i in range(1, layers))
        assert total == pytest.approx(oracle)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 6), st.integers(1, 5), st.integers(0, 24), st.integers(0, 2**31 - 1))
def test_keyed_stage_dp_equals_brute_force(layers: int, strategies: int, budget: int, seed: int) -> None:
    """Switching costs the cost model's way: the entering strategy's re-layout, when keys differ."""
    rng = np.random.default_rng(seed)
    t = rng.uniform(0, 10, (layers, strategies))
    mem = rng.integers(0, 7, (layers, strategies))
    keys = [int(k) for k in rng.integers(0, 3, strategies)]
    relayout = rng.uniform(0, 3, (max(layers - 1, 0), strategies))
    switch = [np.array([[relayout[i][b] if keys[a] != keys[b] else 0.0 for b in range(strategies)]
                        for a in range(strategies)]) for i in range(layers - 1)]
    sol = solve_stage_keyed(t, mem, keys, relayout, budget)
    oracle = brute_force_stage(t, mem, switch, budget)
    got = float(sol.best_by_budget[budget])
    assert (math.isinf(oracle) and math.isinf(got)) or got == pytest.approx(oracle)
    choice = sol.choices(budget)
    if choice is not None:
        total = sum(t[i, s] for i, s in enumerate(choice)) + sum(switch[i - 1][choice[i - 1], choice[i]]
                                                                  for i in range(1, layers))
        assert total == pytest.approx(oracle)


def _tiny(layers: int = 4) -> TransformerConfig:
    return TransformerConfig("gpt", "tiny", layers, 256, 8, 1024, 4096, 256)


def test_dp_search_equals_brute_force_over_per_layer_assignments() -> None:
    """<= 6 layers, <= 4 devices, one stage: every assignment of the decision tree's strategies to
    the layers, evaluated by the cost model, against the DP search's answer."""
    cfg = _tiny(2)
    cluster = make_cluster(4, 4, "A100-80GB")
    graph_for = lambda b: build_graph(cfg, batch=b)  # noqa: E731
    costs: dict[int, GraphCosts] = {}

    def costs_for(b: int) -> GraphCosts:
        return costs.setdefault(b, GraphCosts(graph_for(b)))

    ev = PlanEvaluator(costs_for, cluster, DEFAULT_CALIBRATION)
    opts = SpaceOptions(zero_stages=(0, 3), checkpointing=True, sequence_parallel="never", both_orders=False)
    # every recomputation, selective too: the search offers none in its place (same buffers with
    # flash attention, less time), which the brute force checks rather than assumes
    strats = [s for light in (Recompute.NONE, Recompute.SELECTIVE) for s in layer_strategies(4, opts, light=light)
              if 8 % (2 * s.dp) == 0 and (light is Recompute.SELECTIVE or s.recompute is Recompute.NONE)]
    blocks = [f"layers.{i}" for i in range(2)]
    budget = 2.2 * GIB
    best = math.inf
    for combo in itertools.product(strats, repeat=2):
        plan = LayerPlan(pp=1, num_microbatches=2, global_batch=8, layers=dict(zip(blocks, combo, strict=True)))
        if ev.memory(plan).peak_bytes <= budget:
            best = min(best, ev.time(plan).step_seconds)
    res = search(graph_for, cluster, global_batch=8, objective="max-throughput", budget_bytes=budget,
                 max_slowdown=0.1, alpha_gib_per_s=None, calibration=DEFAULT_CALIBRATION, options=opts,
                 pp_choices=[1], m_choices=[2])
    assert res.status == "optimal"
    # the DP rounds memory up to 1/512 of the budget, so it may only lose by that rounding
    assert res.peak_bytes <= budget
    assert res.step_seconds >= best - 1e-12
    lenient = math.inf
    for combo in itertools.product(strats, repeat=2):
        plan = LayerPlan(pp=1, num_microbatches=2, global_batch=8, layers=dict(zip(blocks, combo, strict=True)))
        if ev.memory(plan).peak_bytes <= budget * (1 - 8 / 512):
            lenient = min(lenient, ev.time(plan).step_seconds)
    assert res.step_seconds <= lenient + 1e-12


@pytest.mark.parametrize(("weights", "p"), [([1, 2, 3, 4, 5, 6], 3), ([5, 1, 1, 1, 1, 5], 2), ([3] * 7, 4)])
def test_balanced_partition_minimises_the_largest_stage(weights: list[float], p: int) -> None:
    got = balanced_partition(weights, p, lambda stage, w: w)
    best = math.inf
    for cuts in itertools.combinations(range(1, len(weights)), p - 1):
        bounds = [0, *cuts, len(weights)]
        best = min(best, max(sum(weights[a:b]) for a, b in itertools.pairwise(bounds)))
    bounds = np.cumsum([0, *got])
    assert max(sum(weights[a:b]) for a, b in itertools.pairwise(bounds)) == pytest.approx(best)
    assert sum(got) == len(weights)


def _body(**over: object) -> dict[str, object]:
    body: dict[str, object] = {"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": 16, "gpus_per_node": 8},
                               "training": {"global_batch": 64, "seq_len": 1024},
                               "objective": {"kind": "max-throughput"}, "search": "dp"}
    body.update(over)
    return body


def test_dp_plan_is_never_slower_than_megatron_and_fits_the_budget() -> None:
    doc = solve(parse_plan_request(_body()))
    assert doc["solver"]["method"] == "dp"
    mlm = doc["baselines"]["megatron"]
    assert doc["time"]["step_seconds"] <= mlm["time"]["step_seconds"] * (1 + 1e-9)
    assert doc["memory"]["peak_bytes"] <= doc["objective"]["memory_budget_bytes"]
    assert doc["pareto"], "the memory vs time frontier is reported"
    times = [p["step_seconds"] for p in doc["pareto"]]
    mems = [p["peak_bytes"] for p in doc["pareto"]]
    assert times == sorted(times)
    assert mems == sorted(mems, reverse=True)


def test_min_memory_stays_within_the_slowdown() -> None:
    fast = solve(parse_plan_request(_body()))
    lean = solve(parse_plan_request(_body(objective={"kind": "min-memory", "max_slowdown": 0.1})))
    assert lean["memory"]["peak_bytes"] < fast["memory"]["peak_bytes"]
    assert lean["time"]["step_seconds"] <= fast["solver"]["best_time_seconds"] * 1.1 * (1 + 1e-9)


def test_bi_objective_partition_beats_the_even_one_on_an_imbalanced_model() -> None:
    """A large LM head on the last stage: moving blocks off that stage shortens the pipeline."""
    cfg = TransformerConfig("gpt", "big-head", 8, 512, 8, 2048, 262144, 512)
    cluster = make_cluster(4, 4, "A100-80GB")
    ds = DpSearch(lambda b: build_graph(cfg, batch=b), cluster, 32, DEFAULT_CALIBRATION, 80 * GIB)
    m = 8
    strats = ds.strategies(4, m)
    even = even_partition(8, 4)
    parts = ds.partitions(4, m, strats)
    assert even in parts
    assert parts[0] != even  # the memory-balanced partition is not the even split here

    def step(part: tuple[int, ...]) -> float:
        cand = ds.solve_candidate(4, m, part, strats)
        assert cand is not None
        plan = ds.plan_at(cand, 512)
        assert plan is not None
        return ds.ev.time(plan).step_seconds

    best = min(step(p) for p in parts if p != even)
    assert best < step(even)


def test_a_model_that_fits_nowhere_gets_the_least_memory_it_needs() -> None:
    doc = solve(parse_plan_request(_body(model={"preset": "gpt-18.4b"}, cluster={"gpus": 2},
                                         objective={"memory_budget_gib": 4})))
    assert doc["memory"] is None
    assert doc["solver"]["status"] == "infeasible"
    assert doc["least_memory_bytes"] > 4 * GIB
    assert "least memory" in doc["message"]


def test_moe_layers_use_expert_parallelism() -> None:
    cfg = get_preset("mixtral-8x7b").with_(layers=2, hidden=512, heads=8, kv_heads=4, ffn=1024, vocab=1024,
                                           seq_len=256)
    cluster = make_cluster(8, 8, "A100-80GB")
    ds = DpSearch(lambda b: build_graph(cfg, batch=b), cluster, 16, DEFAULT_CALIBRATION, 80 * GIB)
    assert ds.moe
    assert any(s.ep > 1 for s in ds.strategies(1, 2))
    res = search(lambda b: build_graph(cfg, batch=b), cluster, global_batch=16, objective="max-throughput",
                 budget_bytes=80 * GIB, max_slowdown=0.1, alpha_gib_per_s=None, calibration=DEFAULT_CALIBRATION)
    assert res.status == "optimal"


def test_t5_encoder_and_decoder_blocks_are_priced_apart() -> None:
    cfg = get_preset("t5-11b").with_(layers=2, decoder_layers=2, hidden=256, heads=4, head_dim=64, ffn=1024,
                                     vocab=1024, seq_len=128)
    gc = GraphCosts(build_graph(cfg, batch=2))
    reps = {gc.representative[u] for u in gc.units if u.startswith(("encoder.", "decoder.")) and u[-1].isdigit()}
    assert any(r.startswith("encoder") for r in reps)
    assert any(r.startswith("decoder") for r in reps)
    res = search(lambda b: build_graph(cfg, batch=b), make_cluster(4, 4, "A100-80GB"), global_batch=8,
                 objective="max-throughput", budget_bytes=80 * GIB, max_slowdown=0.1, alpha_gib_per_s=None,
                 calibration=DEFAULT_CALIBRATION)
    assert res.status == "optimal"


def test_auto_falls_back_to_the_dp_plan_when_the_ilp_runs_out_of_time(monkeypatch: pytest.MonkeyPatch) -> None:
    # the ILP search runs as it is, with a time limit it cannot meet whatever the machine's load;
    # the DP keeps a limit it meets even on a loaded machine (a small limit for both was flaky)
    from parplan.solver.ilp import search as ilp_search

    real = ilp_search.search
    monkeypatch.setattr(ilp_search, "search", lambda *a, **k: real(*a, **{**k, "timeout_seconds": 1e-9}))
    body = _body(model={"preset": "t5-11b"}, cluster={"gpus": 8}, training={"global_batch": 16},
                 objective={"kind": "min-memory"}, search="auto", time_limit=600)
    doc = solve(parse_plan_request(body))
    assert doc["memory"] is not None
    assert doc["solver"]["method"] != "ilp"  # the DP's plan, or a baseline better than it
    assert "the ILP stopped" in doc["solver"]["why"]


def test_the_whole_frontier_is_searched_when_asked() -> None:
    """``pareto: true`` walks every candidate's budget ladder: the frontier it reports holds every
    point of the default, pruned search's frontier or one at least as good on both axes, and the
    answer is the same."""
    part = solve(parse_plan_request(_body(objective={"kind": "min-memory"})))
    whole = solve(parse_plan_request(_body(objective={"kind": "min-memory"}, pareto=True)))
    assert (part["solver"]["pareto"], whole["solver"]["pareto"]) == ("partial", "complete")
    assert whole["solver"]["work"]["stage_solves"] > part["solver"]["work"]["stage_solves"]
    assert len(whole["pareto"]) >= len(part["pareto"])
    for p in part["pareto"]:
        assert any(w["step_seconds"] <= p["step_seconds"] * (1 + 1e-9) and w["peak_bytes"] <= p["peak_bytes"]
                   for w in whole["pareto"])
    assert whole["strategy"] == part["strategy"]
    assert request_hash(_body(pareto=True)) != request_hash(_body())
    assert request_hash(_body(pareto=False)) == request_hash(_body())
    with pytest.raises(RequestError, match="pareto"):
        parse_plan_request(_body(pareto="yes"))


def test_expert_parallelism_never_exceeds_the_experts() -> None:
    """An expert-parallel degree splits the experts: it divides their number. Mixtral-8x22B's 8
    experts on 64 GPUs once came back as ep64; the search now offers only divisors of 8, and the
    evaluator refuses a plan that does not."""
    from parplan.solver.cost.plan_evaluator import LayerPlan, LayerStrategy, PlanEvaluator
    from parplan.solver.errors import StrategyError

    cfg = get_preset("mixtral-8x7b").with_(layers=2, hidden=256, heads=8, kv_heads=4, ffn=512, vocab=512, seq_len=64)
    cluster = make_cluster(64, 8, "H100-80GB")
    ds = DpSearch(lambda b: build_graph(cfg, batch=b), cluster, 64, DEFAULT_CALIBRATION, 80 * GIB)
    eps = {s.ep for pp in (1, 2) for s in ds.strategies(pp, 1)}
    assert eps == {1, 2, 4, 8}
    gc = GraphCosts(build_graph(cfg, batch=1))
    ev = PlanEvaluator(lambda b: gc, cluster)
    bad = LayerStrategy(tp=1, dp=64, ep=16)
    plan = LayerPlan(pp=1, num_microbatches=1, global_batch=64, layers=dict.fromkeys(gc.units, bad))
    with pytest.raises(StrategyError, match="ep=16 does not divide its 8 experts"):
        ev.time(plan)

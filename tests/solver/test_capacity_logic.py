"""Capacity sweeps' choices checked against brute force over the cells (every subset ordering and
pair compared directly), the GPU-count rule against its definition written out, and the replan
rules and switch cost against figures computed by hand."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parplan.solver.capacity import (
    CapacityError,
    CellOutcome,
    Goal,
    Pool,
    gpu_counts,
    summarise,
)
from parplan.solver.replan import Layout, blocked, layout_of, new_gpu_count, rule_for, switch_cost

POOLS = (Pool("A100-80GB", 8, 64, 1.5), Pool("H100-80GB", 8, 64, 2.5))


def test_gpu_counts_are_sub_node_powers_of_two_and_whole_nodes() -> None:
    assert gpu_counts(8, 64) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
    assert gpu_counts(8, 20) == (1, 2, 4, 8, 16)  # 20 GPUs: two whole nodes
    assert gpu_counts(8, 3) == (1, 2)
    assert gpu_counts(6, 12) == (1, 2, 4, 6, 12)
    assert gpu_counts(1, 3) == (1, 2, 3)
    with pytest.raises(CapacityError) as e:
        gpu_counts(8, 0)
    assert e.value.field == "max_gpus"


@given(st.integers(1, 16), st.integers(1, 300))
def test_gpu_counts_match_their_definition(per_node: int, max_gpus: int) -> None:
    want = [n for n in range(1, max_gpus + 1)
            if (n % per_node == 0) or (n < per_node and n & (n - 1) == 0)]
    assert list(gpu_counts(per_node, max_gpus)) == want


outcomes = st.lists(st.tuples(st.sampled_from(POOLS), st.integers(0, 6), st.booleans(),
                              st.floats(1e3, 1e6)), min_size=1, max_size=12)


def _cells(drawn: list[tuple[Pool, int, bool, float]]) -> list[CellOutcome]:
    seen: dict[tuple[str, int], CellOutcome] = {}
    for pool, k, fits, tps in drawn:
        n = 1 << k
        seen[(pool.gpu, n)] = CellOutcome(pool.gpu, n, "done", fits=fits, tokens_per_second=tps,
                                          step_seconds=1.0)
    return list(seen.values())


@settings(max_examples=60, deadline=None)
@given(outcomes, st.floats(0.1, 1e4), st.floats(1.0, 1e7))
def test_choices_equal_brute_force_over_the_cells(drawn: list[tuple[Pool, int, bool, float]],
                                                  deadline: float, budget: float) -> None:
    tokens = 1e10
    cells = _cells(drawn)
    s = summarise(POOLS, cells, tokens, Goal(deadline_hours=deadline, budget=budget))
    price = {p.gpu: p.price_per_gpu_hour for p in POOLS}
    # By hand: hours = tokens / tps / 3600; cost = hours * GPUs * price.
    points = [(c, tokens / c.tokens_per_second / 3600, tokens / c.tokens_per_second / 3600 * c.gpus * price[c.gpu])
              for c in cells if c.fits and c.tokens_per_second]
    meeting = [p for p in points if p[1] <= deadline]
    if meeting:
        best = min(p[2] for p in meeting)
        assert s.cheapest_meeting_deadline is not None
        assert s.cheapest_meeting_deadline.cost == pytest.approx(best)
    else:
        assert s.cheapest_meeting_deadline is None and s.goal_met is False
    within = [p for p in points if p[2] <= budget]
    if within:
        assert s.fastest_within_budget is not None
        assert s.fastest_within_budget.time_to_train_hours == pytest.approx(min(p[1] for p in within))
    else:
        assert s.fastest_within_budget is None
    # The frontier: exactly the points no other point dominates (pairwise comparison).
    dominated = {id(a[0]) for a, b in itertools.permutations(points, 2)
                 if b[1] <= a[1] and b[2] <= a[2] and (b[1] < a[1] or b[2] < a[2])}
    undominated = {(p[1], p[2]) for p in points if id(p[0]) not in dominated}
    got = [(c.time_to_train_hours, c.cost) for c in s.frontier]
    assert set(got) == undominated and len(got) == len(undominated)
    for pool in POOLS:
        fitting = [c.gpus for c in cells if c.gpu == pool.gpu and c.fits]
        assert dict(s.fewest_gpus_that_fit)[pool.gpu] == (min(fitting) if fitting else None)


def test_scaling_efficiency_is_per_gpu_throughput_over_the_smallest_fitting_cell() -> None:
    cells = [CellOutcome("A100-80GB", 1, "done", fits=False), CellOutcome("A100-80GB", 2, "done", fits=True,
                                                                           tokens_per_second=100.0),
             CellOutcome("A100-80GB", 8, "done", fits=True, tokens_per_second=300.0),
             CellOutcome("H100-80GB", 8, "pending")]
    s = summarise(POOLS, cells, 3.6e5, Goal())
    eff = [c.scaling_efficiency for c in s.cells]
    assert eff == [None, 1.0, pytest.approx((300 / 8) / (100 / 2)), None]
    # 3.6e5 tokens at 100 tokens/s: 1 hour on 2 GPUs at 1.5 per GPU-hour.
    assert s.cells[1].time_to_train_hours == pytest.approx(1.0) and s.cells[1].cost == pytest.approx(3.0)
    assert not s.complete and s.goal_met is None


def _layout(tp: int, pp: int, dp: int) -> Layout:
    return Layout((("tp", (tp,)), ("pp", (pp,)), ("dp", (dp,)), ("cp", (1,)), ("ep", (1,))))


def test_resume_rules_per_target() -> None:
    old, new = _layout(8, 4, 2), _layout(8, 7, 1)
    megatron = rule_for("megatron")
    assert megatron is not None and blocked(megatron, old, new) == ()
    dp_only = rule_for("megatron", reshardable_optimizer=False)
    assert dp_only is not None and [r.split()[0] for r in blocked(dp_only, old, new)] == ["pp"]
    assert blocked(dp_only, old, _layout(8, 4, 1)) == ()
    titan = rule_for("torchtitan")
    assert titan is not None and blocked(titan, old, _layout(4, 2, 7)) == ()
    ds = rule_for("deepspeed")
    assert ds is not None and len(blocked(ds, old, _layout(8, 4, 1))) == 1
    assert rule_for("any") is None
    # A per-operator (ILP) plan has no degrees: it loads only where every axis reshards.
    assert layout_of({"strategy": {"kind": "intra-operator", "mesh": {"shape": [2]}}}) is None
    assert blocked(titan, None, new) == () and len(blocked(dp_only, None, new)) == 1
    per_layer = {"strategy": {"kind": "per-layer", "pp": 2, "layers": [{"tp": 4, "dp": 2}, {"tp": 2, "dp": 4}]}}
    assert layout_of(per_layer) == Layout((("tp", (2, 4)), ("pp", (2,)), ("dp", (2, 4)), ("cp", (1,)), ("ep", (1,))))


def test_switch_cost_by_hand() -> None:
    # 70e9 parameters x 14 bytes = 980 GB; at 10 GB/s: 98 s each way. A failure loses half of a
    # 1000-step interval: 500 steps x 12 s = 6000 s; no save.
    failed = switch_cost(70e9, rule_for("megatron"), 10e9, 12.0, 1000, planned=False)
    assert failed.checkpoint_bytes == pytest.approx(980e9) and failed.save_seconds == 0.0
    assert failed.load_seconds == pytest.approx(98.0) and failed.lost_seconds == pytest.approx(6000.0)
    assert failed.total_seconds == pytest.approx(6098.0)
    planned = switch_cost(70e9, rule_for("torchtitan"), 10e9, 12.0, 1000, planned=True)
    assert planned.total_seconds == pytest.approx(2 * 70e9 * 12 / 10e9) and planned.lost_steps == 0.0
    assert new_gpu_count(64, 8, nodes_lost=1) == 56 and new_gpu_count(64, 8, new_gpus=72) == 72
    with pytest.raises(CapacityError):
        new_gpu_count(16, 8, nodes_lost=2)

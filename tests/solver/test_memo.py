"""The evaluator's memo layer: a value is priced once per key, and what it keeps is what the pure
pricing functions give afresh."""

from __future__ import annotations

import functools

import pytest

from parplan.solver.calibration import DEFAULT_CALIBRATION
from parplan.solver.cluster import make_cluster
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.layer_plan import LayerPlan, LayerStrategy
from parplan.solver.cost.memo import Memo
from parplan.solver.cost.pipeline import blocks_of
from parplan.solver.cost.plan_evaluator import PlanEvaluator
from parplan.solver.cost.plan_structure import plan_layout
from parplan.solver.cost.stage_memory import price_memory, stage_memory, unit_memory
from parplan.solver.cost.stage_time import price_time, stage_time
from parplan.solver.cost.units import GraphCosts
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.strategy import Schedule

CFG = TransformerConfig("gpt", "tiny", 8, 256, 8, 1024, 4096, 256)


def test_a_memo_prices_once_per_key_and_counts_its_requests() -> None:
    calls: list[int] = []

    def square(x: int) -> int:
        calls.append(x)
        return x * x

    memo: Memo[int, int] = Memo()
    assert [memo(x, square, x) for x in (3, 4, 3, 3, 4)] == [9, 16, 9, 9, 16]
    assert calls == [3, 4]
    assert (memo.requests, memo.computed, memo.hits, len(memo)) == (5, 2, 3, 2)


def test_a_memo_keeps_a_value_of_none() -> None:
    calls: list[str] = []
    memo: Memo[str, None] = Memo()
    for _ in range(3):
        memo("k", calls.append, "k")
    assert calls == ["k"]


def test_a_disabled_memo_prices_every_request_and_keeps_nothing() -> None:
    calls: list[int] = []

    def count() -> int:
        calls.append(1)
        return len(calls)

    memo: Memo[int, int] = Memo(enabled=False)
    assert [memo(1, count) for _ in range(3)] == [1, 2, 3]
    assert (memo.requests, memo.computed, memo.hits, len(memo)) == (3, 3, 0, 0)


def _evaluators() -> tuple[PlanEvaluator, PlanEvaluator]:
    cluster = make_cluster(8, 8, "A100-80GB")
    costs = functools.cache(lambda b: GraphCosts(build_graph(CFG, batch=b)))
    return (PlanEvaluator(costs, cluster, DEFAULT_CALIBRATION),
            PlanEvaluator(costs, cluster, DEFAULT_CALIBRATION, cache=False))


def _plan(schedule: Schedule = Schedule.ONE_F_ONE_B, uniform: bool = True) -> LayerPlan:
    blocks = blocks_of(build_graph(CFG, batch=1))
    a = LayerStrategy(tp=2, dp=2, zero=1, sp=True)
    b = LayerStrategy(tp=1, dp=4, zero=3, recompute=Recompute.FULL)
    layers = {u: a if uniform or k % 2 else b for k, u in enumerate(blocks)}
    return LayerPlan(pp=2, num_microbatches=4, global_batch=32, layers=layers, schedule=schedule,
                     virtual_stages=2 if schedule is Schedule.INTERLEAVED else 1)


@pytest.mark.parametrize("schedule", [Schedule.ONE_F_ONE_B, Schedule.GPIPE, Schedule.INTERLEAVED])
@pytest.mark.parametrize("uniform", [True, False])
def test_a_plan_is_priced_once_and_as_the_pure_functions_price_it(schedule: Schedule, uniform: bool) -> None:
    ev, fresh = _evaluators()
    plan = _plan(schedule, uniform)
    first = (ev.memory(plan), ev.time(plan))
    again = (ev.memory(plan), ev.time(plan))
    assert first == again
    assert first == (price_memory(fresh, plan), price_time(fresh, plan))
    assert ev.work == {"plan_memory_requests": 2, "plan_memory_evaluations": 1, "plan_time_requests": 2,
                       "plan_time_evaluations": 1}
    fresh.memory(plan)
    fresh.memory(plan)
    assert fresh.work["plan_memory_requests"] == fresh.work["plan_memory_evaluations"] == 2


def test_kept_stages_and_units_are_what_pricing_them_afresh_gives() -> None:
    """A stage kept for another plan's stage (alike units, another index) and a unit kept for an
    alike unit: the figures of the pure functions, under this stage's index and unit's name."""
    ev, fresh = _evaluators()
    plan = _plan()
    layout = plan_layout(ev, plan)
    for stage in range(plan.pp):
        assert ev.stage_memory(plan, stage, layout) == stage_memory(fresh, plan, stage, layout)
        assert ev.stage_time(plan, stage, layout) == stage_time(fresh, plan, stage, layout)
        assert ev.stage_time(plan, stage, layout).stage == stage
    blocks = [u for u in layout.by_stage[0] if u in plan.layers]
    gc = ev.costs_for(plan.local_batch(plan.first_strategy))
    assert gc.representative[blocks[1]] == gc.representative[blocks[2]]
    for u in blocks[1:3]:
        kept = ev.stage_unit_memory(plan, u, layout.strat[u], layout.prec, set(), set())
        assert kept.walk.name == u
        assert kept == unit_memory(fresh, gc, plan, u, layout.strat[u], layout.prec, set(), set())

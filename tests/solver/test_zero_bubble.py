"""Zero-bubble schedules against PyTorch's own order generation (torch/distributed/pipelining/
schedules.py), where torch is installed: the orders parplan runs its memory and time on, the closed
forms of the in-flight micro-batches, and the step time against a list scheduler written here."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from parplan.solver.cost.runtime import Runtime
from parplan.solver.cost.zero_bubble import (
    interleaved_zb_bubble,
    interleaved_zb_rank_order,
    zb_in_flight_chunks,
    zbv_makespan,
    zbv_rank_order,
)
from parplan.solver.errors import StrategyError
from parplan.solver.strategy import ParallelConfig, Schedule

schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
C = schedules._ComputationType

#: (pp, micro-batches) under both schedules; interleaved-zb's counts are multiples of their rounds
GRID = [(2, 1), (2, 2), (2, 3), (2, 4), (2, 8), (3, 2), (3, 4), (3, 6), (3, 8), (4, 2), (4, 4), (4, 6), (4, 8), (4, 16),
        (5, 10)]


def torch_order(zbv: bool, pp: int, m: int, v: int) -> dict[int, list[Any]]:
    """PyTorch's per-rank actions (its ``_calculate_single_rank_operations``, no process group:
    the attributes its constructor sets before calling it), the empty slots dropped."""
    cls = schedules.ScheduleZBVZeroBubble if zbv else schedules.ScheduleInterleavedZeroBubble
    o = object.__new__(cls)
    o.pp_group_size, o.n_local_stages, o._n_microbatches, o.num_stages = pp, v, m, pp * v
    o.number_of_rounds = max(1, m // pp)
    o.microbatches_per_round = m // o.number_of_rounds
    return {r: [a for a in o._calculate_single_rank_operations(r) if a is not None] for r in range(pp)}


def _chunk(zbv: bool, pp: int, stage: int) -> int:
    if zbv:
        return 0 if stage < pp else 1
    return stage // pp


_KIND = {C.FORWARD: "F", C.BACKWARD_INPUT: "I", C.BACKWARD_WEIGHT: "W"}


@pytest.mark.parametrize(("zbv", "v"), [(False, 1), (False, 2), (False, 3), (True, 2)])
def test_rank_orders_are_pytorchs(zbv: bool, v: int) -> None:
    for pp, m in GRID:
        if not zbv and m % max(1, m // pp):
            continue
        for r, actions in torch_order(zbv, pp, m, v).items():
            ours = zbv_rank_order(pp, m, r) if zbv else interleaved_zb_rank_order(pp, v, m, r)
            assert ours == [(_KIND[a.computation_type], _chunk(zbv, pp, a.stage_index)) for a in actions], (pp, m, r)


@pytest.mark.parametrize(("zbv", "v"), [(False, 1), (False, 2), (False, 3), (True, 2)])
def test_in_flight_closed_form_counts_pytorchs_order(zbv: bool, v: int) -> None:
    """A (chunk, micro-batch) is alive from its forward to the end of its W (``stage_backward_input``
    retains the graph for it): the most alive per rank over PyTorch's order is the closed form."""
    for pp, m in GRID:
        if not zbv and m % max(1, m // pp):
            continue
        for r, actions in torch_order(zbv, pp, m, v).items():
            live: set[tuple[int, int]] = set()
            most = 0
            for a in actions:
                if a.computation_type == C.FORWARD:
                    live.add((a.stage_index, a.microbatch_index))
                    most = max(most, len(live))
                elif a.computation_type == C.BACKWARD_WEIGHT:
                    live.remove((a.stage_index, a.microbatch_index))
            assert most == zb_in_flight_chunks(zbv, pp, v, m, r), (pp, m, r)


def list_schedule(order: dict[int, list[Any]], pp: int, v: int, f: float, b: float, w: float) -> float:
    """Makespan of PyTorch's order: each rank runs its actions in order, each as soon as the rank is
    free and its input has arrived (chunk times: the device's over ``v``)."""
    last = pp * v - 1
    done: dict[tuple[str, int, int], float] = {}
    free, pos = dict.fromkeys(order, 0.0), dict.fromkeys(order, 0)
    dur = {"F": f / v, "I": b / v, "W": w / v}
    progress = True
    while progress:
        progress = False
        for r, actions in order.items():
            while pos[r] < len(actions):
                a = actions[pos[r]]
                kind, s, mb = _KIND[a.computation_type], a.stage_index, a.microbatch_index
                dep = {"F": ("F", s - 1, mb), "I": ("I", s + 1, mb) if s < last else ("F", s, mb),
                       "W": ("I", s, mb)}[kind]
                if kind == "F" and s == 0:
                    ready = 0.0
                elif dep in done:
                    ready = done[dep]
                else:
                    break
                free[r] = done[kind, s, mb] = max(free[r], ready) + dur[kind]
                pos[r] += 1
                progress = True
    assert all(pos[r] == len(a) for r, a in order.items())
    return max(free.values())


@pytest.mark.parametrize(("f", "b", "w"), [(1.0, 1.0, 1.0), (1.0, 1.2, 0.8), (1.0, 2.0, 1.0), (1.0, 1.5, 0.3)])
def test_step_time_is_the_makespan_of_pytorchs_order(f: float, b: float, w: float) -> None:
    """Equal stages: interleaved-zb's step is ``m(F + B + W) + (p − 1)(F + B − W)/v`` (the paper's
    ZB-H1 bubble over the chunks) and zbv's the makespan parplan schedules, both equal to the
    makespan of PyTorch's own order."""
    for pp, m in [(2, 2), (2, 8), (3, 3), (3, 6), (4, 4), (4, 8), (4, 16)]:
        for v in (1, 2):
            ours = m * (f + b + w) + interleaved_zb_bubble([f] * pp, [b] * pp, [w] * pp, 0, v)
            assert ours == pytest.approx(list_schedule(torch_order(False, pp, m, v), pp, v, f, b, w)), (pp, m, v)
        assert zbv_makespan([f] * pp, [b] * pp, [w] * pp, m) == pytest.approx(
            list_schedule(torch_order(True, pp, m, 2), pp, 2, f, b, w)), (pp, m)


def test_zero_bubble_schedules_are_refused_off_torch_pipelining() -> None:
    ok = ParallelConfig(pp=2, num_microbatches=4, schedule=Schedule.ZBV, virtual_stages=2, runtime=Runtime.TORCHTITAN)
    assert ok.describe().endswith("zbv(v=2)")
    with pytest.raises(StrategyError, match=r"torch\.distributed\.pipelining"):
        ParallelConfig(pp=2, num_microbatches=4, schedule=Schedule.ZBV, virtual_stages=2)
    with pytest.raises(StrategyError, match="exactly 2 chunks"):
        ParallelConfig(pp=2, num_microbatches=4, schedule=Schedule.ZBV, virtual_stages=3, runtime=Runtime.TORCH)
    with pytest.raises(StrategyError, match="rounds"):
        ParallelConfig(pp=4, num_microbatches=9, schedule=Schedule.INTERLEAVED_ZB, runtime=Runtime.TORCH)
    with pytest.raises(StrategyError, match="pp > 1"):
        ParallelConfig(pp=1, num_microbatches=4, schedule=Schedule.INTERLEAVED_ZB, runtime=Runtime.TORCH)


def test_zbv_places_the_first_and_last_chunks_on_rank_0_and_prices_faster_than_1f1b() -> None:
    """PyTorch's V: rank i runs virtual stages i and 2p − 1 − i, so rank 0 holds the embedding, the
    first and the last blocks and the head; each rank keeps (in its layers) at least the closed
    form's p micro-batches of activations; the step is shorter than 1F1B's (same work, less bubble)."""
    from parplan.solver.cluster import make_cluster
    from parplan.solver.cost.activations import Recompute
    from parplan.solver.cost.plan_memory import plan_memory
    from parplan.solver.cost.plan_time import plan_time
    from parplan.solver.frontends.builder import build_graph
    from parplan.solver.frontends.config import TransformerConfig

    graph = build_graph(TransformerConfig("gpt", "gpt-test", 8, 256, 8, 1024, 512, 128), batch=2)
    one_f_one_b = ParallelConfig(pp=4, num_microbatches=8, runtime=Runtime.TORCHTITAN, recompute=Recompute.FULL)
    zbv = replace(one_f_one_b, schedule=Schedule.ZBV, virtual_stages=2)
    stages = plan_memory(graph, zbv).stages
    assert stages[0].units == ("embed", "layers.0", "layers.7", "head")
    assert stages[3].units == ("layers.3", "layers.4")
    for st in stages[1:]:  # equal chunks: p micro-batches of the rank's layers at least
        assert st.memory.bytes.activations >= 4 * st.activation_bytes_per_microbatch
    cluster = make_cluster(4, 4, "A100-80GB")
    one = plan_time(graph, one_f_one_b, cluster)
    assert plan_time(graph, zbv, cluster).step_seconds < one.step_seconds

"""Zero-bubble schedules against PyTorch's own order generation (torch/distributed/pipelining/
schedules.py), where torch is installed: the orders parplan runs its memory and time on, the closed
forms of the in-flight micro-batches, and the step time against a list scheduler written here."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from parplan.solver.cost.runtime import Runtime
from parplan.solver.cost.zero_bubble import (
    dualpipev_rank_order,
    interleaved_zb_bubble,
    interleaved_zb_rank_order,
    v_makespan,
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
            schedule = Schedule.ZBV if zbv else Schedule.INTERLEAVED_ZB
            assert most == zb_in_flight_chunks(schedule, pp, v, m, r), (pp, m, r)


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
    with pytest.raises(StrategyError, match="at least 2pp = 4 micro-batches"):
        ParallelConfig(pp=2, num_microbatches=3, schedule=Schedule.DUALPIPEV, virtual_stages=2, runtime=Runtime.TORCH)
    with pytest.raises(StrategyError, match="pp > 1"):
        ParallelConfig(pp=1, num_microbatches=4, schedule=Schedule.INTERLEAVED_ZB, runtime=Runtime.TORCH)


@pytest.mark.parametrize("schedule", [Schedule.ZBV, Schedule.DUALPIPEV])
def test_v_places_the_first_and_last_chunks_on_rank_0_and_prices_faster_than_1f1b(schedule: Schedule) -> None:
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
    zbv = replace(one_f_one_b, schedule=schedule, virtual_stages=2)
    stages = plan_memory(graph, zbv).stages
    assert stages[0].units == ("embed", "layers.0", "layers.7", "head")
    assert stages[3].units == ("layers.3", "layers.4")
    for st in stages[1:]:  # equal chunks: p micro-batches of the rank's layers at least
        assert st.memory.bytes.activations >= 4 * st.activation_bytes_per_microbatch
    cluster = make_cluster(4, 4, "A100-80GB")
    one = plan_time(graph, one_f_one_b, cluster)
    assert plan_time(graph, zbv, cluster).step_seconds < one.step_seconds


def torch_dualpipev(pp: int, m: int) -> dict[int, list[Any]]:
    """PyTorch's ``ScheduleDualPipeV`` order (as :func:`torch_order`)."""
    o = object.__new__(schedules.ScheduleDualPipeV)
    o.pp_group_size, o.n_local_stages, o._n_microbatches, o.num_stages = pp, 2, m, 2 * pp
    return {r: o._calculate_single_rank_operations(r) for r in range(pp)}


def _dualpipev_action(pp: int, a: Any) -> tuple[str, int]:
    if a.computation_type == C.OVERLAP_F_B:
        return ("O", _chunk(True, pp, a.sub_actions[0].stage_index))
    kind = "B" if a.computation_type == C.FULL_BACKWARD else _KIND[a.computation_type]
    return (kind, _chunk(True, pp, a.stage_index))


def test_dualpipev_rank_orders_are_pytorchs() -> None:
    for pp, m in [(2, 4), (2, 5), (2, 8), (3, 6), (3, 7), (3, 12), (4, 8), (4, 16), (5, 10)]:
        for r, actions in torch_dualpipev(pp, m).items():
            assert dualpipev_rank_order(pp, m, r) == [_dualpipev_action(pp, a) for a in actions], (pp, m, r)


def _flatten(a: Any) -> list[Any]:
    return list(a.sub_actions) if a.computation_type == C.OVERLAP_F_B else [a]


def test_dualpipev_in_flight_closed_form_and_makespan() -> None:
    """Over PyTorch's DualPipeV order every rank holds at most 2p + 1 (chunk, micro-batch) pairs
    (a whole backward frees one, as does a W); the step parplan prices is the makespan of PyTorch's
    order (an overlapped forward and backward start together and take both their times)."""
    for pp, m in [(2, 4), (2, 8), (3, 6), (3, 9), (4, 8), (4, 12), (5, 10)]:
        order = torch_dualpipev(pp, m)
        for r, actions in order.items():
            live: set[tuple[int, int]] = set()
            most = 0
            for a in (s for action in actions for s in _flatten(action)):
                key = (a.stage_index, a.microbatch_index)
                if a.computation_type == C.FORWARD:
                    live.add(key)
                    most = max(most, len(live))
                elif a.computation_type in (C.FULL_BACKWARD, C.BACKWARD_WEIGHT):
                    live.remove(key)
            assert most == zb_in_flight_chunks(Schedule.DUALPIPEV, pp, 2, m, r), (pp, m, r)
        for f, b, w in [(1.0, 1.0, 1.0), (1.0, 1.5, 0.3)]:
            assert _makespan_of(order, pp, f, b, w) == pytest.approx(
                v_makespan([dualpipev_rank_order(pp, m, r) for r in range(pp)], [f] * pp, [b] * pp, [w] * pp))


def _makespan_of(order: dict[int, list[Any]], pp: int, f: float, b: float, w: float) -> float:
    """List scheduling of PyTorch's actions, overlapped ones as one action waiting for both inputs."""
    last = 2 * pp - 1
    done: dict[tuple[str, int, int], float] = {}
    free, pos = dict.fromkeys(order, 0.0), dict.fromkeys(order, 0)
    dur = {C.FORWARD: f / 2, C.BACKWARD_INPUT: b / 2, C.BACKWARD_WEIGHT: w / 2, C.FULL_BACKWARD: (b + w) / 2}

    def dep(a: Any) -> tuple[str, int, int] | None:
        s, mb = a.stage_index, a.microbatch_index
        if a.computation_type == C.FORWARD:
            return ("F", s - 1, mb) if s else None
        if a.computation_type == C.BACKWARD_WEIGHT:
            return None  # its own input gradient, earlier on the rank
        return ("I", s + 1, mb) if s < last else ("F", s, mb)

    progress = True
    while progress:
        progress = False
        for r, actions in order.items():
            while pos[r] < len(actions):
                subs = _flatten(actions[pos[r]])
                deps = [d for d in map(dep, subs) if d is not None]
                if any(d not in done for d in deps):
                    break
                end = max([free[r], *(done[d] for d in deps)]) + sum(dur[a.computation_type] for a in subs)
                for a in subs:
                    kind = {C.FORWARD: "F", C.BACKWARD_WEIGHT: "W"}.get(a.computation_type, "I")
                    done[kind, a.stage_index, a.microbatch_index] = end
                free[r] = end
                pos[r] += 1
                progress = True
    assert all(pos[r] == len(a) for r, a in order.items())
    return max(free.values())

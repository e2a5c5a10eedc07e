"""Megatron-LM's pipeline hand-offs of 2021-22 (``pp_scatter_gather``): without sequence parallelism
each TP rank sends its 1/tp share of the activation to the next stage, which all-gathers it over TP.
The oracle is the α-β closed form written out by hand with the A100 preset's links (HDR InfiniBand
25 GB/s and 8 µs between nodes, NVLink 3 300 GB/s and 3 µs within one)."""

from __future__ import annotations

import dataclasses

import pytest

from parplan.solver.cluster import make_cluster
from parplan.solver.cost.plan_evaluator import shared_evaluator
from parplan.solver.cost.plan_memory import layer_plan
from parplan.solver.cost.plan_time import plan_time
from parplan.solver.cost.runtime import Runtime
from parplan.solver.cost.units import GraphCosts
from parplan.solver.errors import StrategyError
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.strategy import ParallelConfig

SEQ, HIDDEN = 1024, 2048


def _time(**kwargs: object) -> tuple[float, float]:
    """(p2p seconds of a micro-batch on the second stage, step seconds) of a 16-layer GPT in tp 8 x
    pp 2 on two nodes of eight A100s: the stages sit on different nodes, TP inside each."""
    g = build_graph(TransformerConfig("gpt", "t", 16, HIDDEN, 16, 4 * HIDDEN, 32000, SEQ), batch=1)
    t = plan_time(g, ParallelConfig(tp=8, pp=2, num_microbatches=4, **kwargs), make_cluster(16, 8, "A100-80GB"))
    return t.stages[1].p2p_seconds, t.step_seconds


def test_a_hand_off_travels_as_tp_shares_and_is_gathered_over_nvlink() -> None:
    b = SEQ * HIDDEN * 2  # the hidden states of one sample in 16 bits, whole on every TP rank
    whole = 2 * (b / 25e9 + 8e-6)  # received in forward, its gradient sent back in backward
    split = 2 * (b / 8 / 25e9 + 8e-6 + 7 / 8 * b / 300e9 + 7 * 3e-6)
    plain, plain_step = _time()
    scattered, scattered_step = _time(pp_scatter_gather=True)
    assert plain == pytest.approx(whole)
    assert scattered == pytest.approx(split)
    assert scattered_step < plain_step


def test_sequence_parallel_hand_offs_are_split_already_and_unchanged() -> None:
    """Megatron-LM turned the scatter/gather off under sequence parallelism: the tensor is split."""
    assert _time(sequence_parallel=True, pp_scatter_gather=True) == _time(sequence_parallel=True)


def test_pp_scatter_gather_is_megatron_lms() -> None:
    with pytest.raises(StrategyError):
        ParallelConfig(tp=2, pp=2, pp_scatter_gather=True, runtime=Runtime.TORCH)
    assert "pp-scatter-gather" in ParallelConfig(tp=2, pp=2, pp_scatter_gather=True).describe()
    # a per-layer plan, which the searches and the exports' importer build directly, is checked alike
    g = build_graph(TransformerConfig("gpt", "t", 4, 256, 4, 1024, 1000, 128), batch=1)
    plan = dataclasses.replace(layer_plan(g, ParallelConfig(tp=2, pp=2, runtime=Runtime.TORCH)), pp_scatter_gather=True)
    with pytest.raises(StrategyError):
        shared_evaluator(GraphCosts(g), make_cluster(4, 4, "A100-80GB")).time(plan)

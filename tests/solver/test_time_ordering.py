"""The step-time model ranks plans the way the hardware does, on cases whose answer is known
whatever the constants: communication over a slower link takes longer, a deeper pipeline with the
same micro-batches idles longer, interleaving shortens the idle time, ZeRO-3 moves more bytes,
recomputing more takes longer."""

from __future__ import annotations

import pytest

from parplan.solver.cluster import make_cluster
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.plan_time import plan_time
from parplan.solver.cost.runtime import Runtime
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.ir import Graph
from parplan.solver.strategy import ParallelConfig, Schedule


def _graph(layers: int = 16, h: int = 2048, batch: int = 1) -> Graph:
    return build_graph(TransformerConfig("gpt", "t", layers, h, 16, 4 * h, 32000, 1024), batch=batch)


def test_tensor_parallelism_across_nodes_is_slower_than_within() -> None:
    """tp 8 on nodes of 8 GPUs keeps its all-reduces on NVLink; on nodes of 4 they cross the network."""
    g = _graph()
    cfg = ParallelConfig(tp=8)
    within = plan_time(g, cfg, make_cluster(8, 8, "H100-80GB"))
    across = plan_time(g, cfg, make_cluster(8, 4, "H100-80GB"))
    assert across.stages[0].tp_comm_seconds > 1.2 * within.stages[0].tp_comm_seconds
    assert across.step_seconds > within.step_seconds


def test_data_parallel_gradients_over_fewer_nics_take_longer() -> None:
    """The same 16-way all-reduce: in one node of 16, on two nodes of 8 (8 NICs each carry the
    rings), on 16 nodes of 1 (one NIC's bandwidth, every step over the network)."""
    g = _graph()
    cfg = ParallelConfig(dp=16)
    comm = [plan_time(g, cfg, make_cluster(16, gpn, "H100-80GB")).stages[0].dp_comm_seconds for gpn in (16, 8, 1)]
    assert comm[0] < comm[1] < comm[2]


@pytest.mark.parametrize("m", [8, 16])
def test_deeper_pipeline_with_the_same_microbatches_has_a_larger_bubble(m: int) -> None:
    g = _graph()
    bubbles = []
    for pp in (2, 4, 8):
        t = plan_time(g, ParallelConfig(pp=pp, num_microbatches=m), make_cluster(pp, 8, "H100-80GB"))
        bubbles.append(t.bubble_fraction)
    assert bubbles[0] < bubbles[1] < bubbles[2]


@pytest.mark.parametrize("v", [2, 4])
def test_interleaving_reduces_the_bubble(v: int) -> None:
    g = _graph()
    cluster = make_cluster(4, 8, "H100-80GB")
    plain = plan_time(g, ParallelConfig(pp=4, num_microbatches=8), cluster)
    inter = plan_time(g, ParallelConfig(pp=4, num_microbatches=8, schedule=Schedule.INTERLEAVED, virtual_stages=v),
                      cluster)
    assert inter.bubble_fraction < plain.bubble_fraction
    assert inter.step_seconds < plain.step_seconds


def test_zero3_moves_more_than_zero1_and_zero1_no_more_than_plain_data_parallelism() -> None:
    """ZeRO-1 reduce-scatters the gradients and all-gathers the weights (no more than an
    all-reduce); ZeRO-3 gathers the weights again in every forward and backward."""
    g = _graph()
    cluster = make_cluster(16, 8, "H100-80GB")
    comm = {z: plan_time(g, ParallelConfig(dp=16, zero=z), cluster).stages[0].dp_comm_seconds for z in (0, 1, 3)}
    assert comm[1] <= comm[0] < comm[3]


def test_more_microbatches_amortise_the_bubble() -> None:
    g = _graph()
    cluster = make_cluster(4, 8, "H100-80GB")
    bubbles = [plan_time(g, ParallelConfig(pp=4, num_microbatches=m), cluster).bubble_fraction for m in (4, 8, 32)]
    assert bubbles[0] > bubbles[1] > bubbles[2]


@pytest.mark.parametrize("runtime", [Runtime.MEGATRON, Runtime.TORCH, Runtime.TORCHTITAN, Runtime.DEEPSPEED])
@pytest.mark.parametrize("flash", [True, False])
def test_more_recomputation_is_never_faster(runtime: Runtime, flash: bool) -> None:
    """No recomputation runs no forward twice, selective recomputation at most the attention cores,
    full recomputation every block: none <= selective < full, in every runtime, with or without
    flash attention (and none < selective without it, whose scores are rebuilt in every runtime)."""
    g = _graph(layers=4)
    cluster = make_cluster(8, 8, "H100-80GB")
    t = {rc: plan_time(g, ParallelConfig(tp=2, dp=4, zero=1, sequence_parallel=True, recompute=rc, runtime=runtime,
                                          flash_attention=flash), cluster).step_seconds
         for rc in (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)}
    assert t[Recompute.NONE] <= t[Recompute.SELECTIVE] < t[Recompute.FULL]
    if not flash:
        assert t[Recompute.NONE] < t[Recompute.SELECTIVE]

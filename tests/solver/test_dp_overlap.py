"""What data-parallel traffic the step hides, from the order the runtimes run it in:

- ZeRO 1-2 gather the updated weights after the optimizer step, which needs every gradient: no
  backward is left to hide it. Megatron-LM's ``--overlap-param-gather`` runs it under the next
  forward, and so does FSDP without resharding, which gathers each unit before its forward.
- ZeRO-3 gathers each unit's weights before its forward and again before its backward; the
  gradients' reduce-scatter runs in the backward too, over the same links as that gather.

Expected figures are closed forms of the ring collectives and of the schedule (hand numbers), not
the model's own."""

from __future__ import annotations

import pytest

from parplan.solver.cluster import make_cluster
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.plan_time import plan_time
from parplan.solver.cost.rules import exposed_seconds, weight_gather_exposed_seconds
from parplan.solver.cost.runtime import Runtime
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.ir import Graph
from parplan.solver.strategy import ParallelConfig


def _graph(batch: int) -> Graph:
    return build_graph(TransformerConfig("gpt", "t", 16, 2048, 16, 8192, 32000, 1024), batch=batch)


def _weight_gather_bounds(g: Graph, n: int) -> tuple[float, float]:
    """(bandwidth term, bandwidth + every bucket's latency and one more) of a ring all-gather of
    the bf16 weights over ``n`` nodes of one H100 (one 50 GB/s NIC each, 8 us a step), seconds."""
    psi = sum(x.numel for x in g.nodes if x.is_parameter)
    bandwidth = (n - 1) / n * 2 * psi / 50e9
    return bandwidth, bandwidth + (n - 1) * 8e-6 * (psi / 40e6 + 1)


def test_backward_shares_its_time_between_the_reduction_and_the_weight_gather() -> None:
    """Forward 1 s, backward 2 s, each gather 1.2 s, the reduce-scatter 1 s. The forward's gather
    shows 0.2 s; the backward's gather and the reduction, 2.2 s of traffic, 0.2 s more. Each alone
    would fit under the backward, which is what a model that lets each use the whole backward says
    (0 s)."""
    assert exposed_seconds(1.0, 2.4, 1.0, 2.0, 1) == pytest.approx(0.4)
    # three micro-batches, one reduction: every forward shows 0.2 s, the last backward 0.2 s
    assert exposed_seconds(1.0, 2.4, 1.0, 2.0, 3) == pytest.approx(0.8)
    # a backward long enough for both hides them
    assert exposed_seconds(1.0, 2.4, 1.2, 2.2, 2) == pytest.approx(0.0)
    # without ZeRO-3's gathers: the reduction alone under the backward
    assert exposed_seconds(2.5, 0.0, 1.0, 2.0, 4) == pytest.approx(0.5)


def test_the_updated_weights_gather_waits_for_the_optimizer_step() -> None:
    assert weight_gather_exposed_seconds(0.3, 1.0, under_forward=False) == 0.3
    assert weight_gather_exposed_seconds(0.3, 1.0, under_forward=True) == 0.0
    assert weight_gather_exposed_seconds(1.3, 1.0, under_forward=True) == pytest.approx(0.3)


def test_megatron_zero_1_shows_its_whole_weight_gather_unless_overlapped() -> None:
    """16 nodes of one GPU, 32 sequences a micro-batch: each layer's operators outlast their
    gradients' reduce-scatter (backward) and their weights' gather (forward). Without
    ``--overlap-param-gather`` the gather follows the optimizer step, all of it shown; with it,
    hidden as far as each operator's forward lasts. The difference is about the whole gather: the
    embedding's gather (7% of the weights, under a lookup's forward) shows in both."""
    g = _graph(32)
    cluster = make_cluster(16, 1, "H100-80GB")
    low, high = _weight_gather_bounds(g, 16)
    plain = plan_time(g, ParallelConfig(dp=16, zero=1), cluster).stages[0]
    over = plan_time(g, ParallelConfig(dp=16, zero=1, overlap_param_gather=True), cluster).stages[0]
    assert plain.dp_comm_seconds == over.dp_comm_seconds
    assert 0.9 * low <= plain.dp_exposed_seconds - over.dp_exposed_seconds <= high


def test_zero_2_weight_gather_by_runtime() -> None:
    """DeepSpeed's ZeRO-2 gathers the updated partitions at the end of its step; PyTorch's (FSDP
    without resharding after forward) gathers each unit before its forward, under the compute."""
    g = _graph(32)
    cluster = make_cluster(16, 1, "H100-80GB")
    low, high = _weight_gather_bounds(g, 16)
    deepspeed, torch = (plan_time(g, ParallelConfig(dp=16, zero=2, runtime=r), cluster).stages[0]
                        for r in (Runtime.DEEPSPEED, Runtime.TORCH))
    assert deepspeed.dp_comm_seconds == pytest.approx(torch.dp_comm_seconds, rel=0.01)
    assert 0.9 * low <= deepspeed.dp_exposed_seconds - torch.dp_exposed_seconds <= high


def test_zero_3_moves_no_weights_after_the_step() -> None:
    """FSDP's step traffic: per micro-batch two gathers of the bf16 weights, once a step the
    reduce-scatter of the fp32 gradients; ZeRO-2's adds one gather of the updated weights to the
    reduce-scatter and gathers nothing in the micro-batches. With four micro-batches ZeRO-3 moves
    8 gathers and a reduce-scatter (about 8 x 2 + 4 = 20 bytes a parameter), ZeRO-2 one of each
    (2 + 4 = 6)."""
    g = _graph(1)
    cluster = make_cluster(16, 1, "H100-80GB")
    low, high = _weight_gather_bounds(g, 16)
    z3 = plan_time(g, ParallelConfig(dp=16, zero=3, num_microbatches=4, runtime=Runtime.TORCH), cluster).stages[0]
    z2 = plan_time(g, ParallelConfig(dp=16, zero=2, num_microbatches=4, runtime=Runtime.TORCH), cluster).stages[0]
    # the reduce-scatter of fp32 gradients moves twice the bytes of a bf16 gather
    assert 20 * low / 2 * 0.999 <= z3.dp_comm_seconds <= 20 * high / 2 * 1.001
    assert 6 * low / 2 * 0.999 <= z2.dp_comm_seconds <= 6 * high / 2 * 1.001


def test_a_recomputed_forward_runs_in_the_backward_and_hides_traffic_too() -> None:
    """Full recomputation runs each layer's forward again in the backward pass, before its
    gradients exist; the reduction of the gradients already made runs under it. With the traffic
    partly shown (one sequence a micro-batch over 16 nodes), recomputing hides more of it, at
    most as much as the recomputation lasts."""
    g = _graph(1)
    cluster = make_cluster(16, 1, "H100-80GB")
    none, full = (plan_time(g, ParallelConfig(dp=16, recompute=r), cluster).stages[0]
                  for r in (Recompute.NONE, Recompute.FULL))
    assert none.dp_comm_seconds == full.dp_comm_seconds
    assert 0 < none.dp_exposed_seconds - full.dp_exposed_seconds <= full.recompute_seconds


@pytest.mark.parametrize("zero", [1, 3])
def test_fp8_training_moves_the_weights_in_their_own_type(zero: int) -> None:
    """FP8 training keeps bf16 weights and casts their FP8 copies on each rank: the gathers move
    bf16, as without FP8 (the copies double the resident bytes a weight costs, not the traffic)."""
    g = _graph(1)
    cluster = make_cluster(16, 1, "H100-80GB")
    bf16, fp8 = (plan_time(g, ParallelConfig(dp=16, zero=zero, precision=p), cluster).stages[0]
                 for p in ("bf16", "fp8"))
    assert fp8.dp_comm_seconds == pytest.approx(bf16.dp_comm_seconds)

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

from parplan.solver.cluster import gpu_preset, make_cluster
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.kernels import collective_sm_share
from parplan.solver.cost.plan_time import plan_time
from parplan.solver.cost.rules import exposed_seconds, hidden_traffic_seconds, weight_gather_exposed_seconds
from parplan.solver.cost.runtime import Runtime
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.ir import Graph
from parplan.solver.strategy import ParallelConfig

#: the share of an H100's SMs a collective holds: NCCL's 24 CTAs of its 132 SMs
H100_SHARE = 24 / 132


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
    assert exposed_seconds(1.0, 2.4, 1.0, 2.0, 1, slowdown=0.0) == pytest.approx(0.4)
    # three micro-batches, one reduction: every forward shows 0.2 s, the last backward 0.2 s
    assert exposed_seconds(1.0, 2.4, 1.0, 2.0, 3, slowdown=0.0) == pytest.approx(0.8)
    # a backward long enough for both hides them
    assert exposed_seconds(1.0, 2.4, 1.2, 2.2, 2, slowdown=0.0) == pytest.approx(0.0)
    # without ZeRO-3's gathers: the reduction alone under the backward
    assert exposed_seconds(2.5, 0.0, 1.0, 2.0, 4, slowdown=0.0) == pytest.approx(0.5)


def test_the_updated_weights_gather_waits_for_the_optimizer_step() -> None:
    assert weight_gather_exposed_seconds(0.3, 1.0, under_forward=False, slowdown=0.0) == 0.3
    assert weight_gather_exposed_seconds(0.3, 1.0, under_forward=True, slowdown=0.0) == 0.0
    assert weight_gather_exposed_seconds(1.3, 1.0, under_forward=True, slowdown=0.0) == pytest.approx(0.3)


def test_compute_under_traffic_runs_without_the_collectives_sms() -> None:
    """A collective's kernel holds a share of the SMs while it runs; the compute it overlaps runs
    on the others. With a quarter held, 1 s of traffic under 2 s of compute takes 2.25 s (the
    compute at 3/4 speed for 1 s), 3 s of traffic under it 3 s (the compute ends first)."""
    assert hidden_traffic_seconds(1.0, 2.0, 0.25) == pytest.approx(0.25)
    assert hidden_traffic_seconds(3.0, 2.0, 0.25) == pytest.approx(1.0)
    assert hidden_traffic_seconds(1.0, 0.0, 0.25) == 1.0
    assert hidden_traffic_seconds(0.0, 2.0, 0.25) == 0.0
    # the first test's step with a fifth held: the forward's gather (1.2 s under 1 s) costs 0.24 s,
    # not the 0.2 s beyond; the backward's 2.2 s under 2 s, 0.44 s
    assert exposed_seconds(1.0, 2.4, 1.0, 2.0, 1, slowdown=0.2) == pytest.approx(0.68)
    assert weight_gather_exposed_seconds(0.3, 1.0, under_forward=True, slowdown=0.2) == pytest.approx(0.06)
    assert weight_gather_exposed_seconds(0.3, 1.0, under_forward=False, slowdown=0.2) == 0.3


def test_the_held_share_is_nccls_ctas_over_the_sms() -> None:
    """24 CTAs (traced on a DGX A100 and an H100) of 108 and 132 SMs; a GPU without a trace: none."""
    assert collective_sm_share(gpu_preset("A100-80GB")) == pytest.approx(24 / 108)
    assert collective_sm_share(gpu_preset("H100-80GB")) == pytest.approx(H100_SHARE)
    assert collective_sm_share(gpu_preset("H200-141GB")) == pytest.approx(24 / 132)
    assert collective_sm_share(gpu_preset("V100-32GB")) == 0.0
    assert collective_sm_share(gpu_preset("MI300X")) == 0.0


def test_fsdp_traffic_hidden_under_compute_still_costs_the_sms_it_holds() -> None:
    """FSDP on 16 nodes, 32 sequences a micro-batch: the gathers and the reduce-scatter run under
    the blocks' compute, yet every second of them costs at least the held share of a second."""
    g = _graph(64)
    cluster = make_cluster(16, 1, "H100-80GB")
    t = plan_time(g, ParallelConfig(dp=16, zero=3, runtime=Runtime.TORCH), cluster).stages[0]
    assert H100_SHARE * t.dp_comm_seconds * 0.999 <= t.dp_exposed_seconds < 0.5 * t.dp_comm_seconds


def test_megatron_zero_1_shows_its_whole_weight_gather_unless_overlapped() -> None:
    """16 nodes of one GPU, 32 sequences a micro-batch: each layer's operators outlast their
    gradients' reduce-scatter (backward) and their weights' gather (forward). Without
    ``--overlap-param-gather`` the gather follows the optimizer step, all of it shown; with it,
    hidden as far as each operator's forward lasts, though the forward runs without the SMs the
    gather holds (24 of the H100's 132) meanwhile. The difference is about the whole gather less
    that share: the embedding's gather (7% of the weights, under a lookup's forward) shows in both."""
    g = _graph(32)
    cluster = make_cluster(16, 1, "H100-80GB")
    low, high = _weight_gather_bounds(g, 16)
    plain = plan_time(g, ParallelConfig(dp=16, zero=1), cluster).stages[0]
    over = plan_time(g, ParallelConfig(dp=16, zero=1, overlap_param_gather=True), cluster).stages[0]
    assert plain.dp_comm_seconds == over.dp_comm_seconds
    assert 0.9 * (1 - H100_SHARE) * low <= plain.dp_exposed_seconds - over.dp_exposed_seconds <= high


def test_zero_2_weight_gather_by_runtime() -> None:
    """DeepSpeed's ZeRO-2 gathers the updated partitions at the end of its step; PyTorch's (FSDP
    without resharding after forward) gathers each unit before its forward, under the compute (which
    runs without the SMs the gather holds meanwhile). PyTorch's adds FSDP2's copies, on the HBM: the
    gathered weights split out (bf16 read and written) and the gradients copied into the
    reduce-scatter's input (bf16 read, fp32 written), 10 bytes a parameter at 0.8 of 3.35 TB/s."""
    g = _graph(32)
    cluster = make_cluster(16, 1, "H100-80GB")
    low, high = _weight_gather_bounds(g, 16)
    deepspeed, torch = (plan_time(g, ParallelConfig(dp=16, zero=2, runtime=r), cluster).stages[0]
                        for r in (Runtime.DEEPSPEED, Runtime.TORCH))
    assert deepspeed.dp_comm_seconds == pytest.approx(torch.dp_comm_seconds, rel=0.01)
    copies = 10 * sum(x.numel for x in g.nodes if x.is_parameter) / (0.8 * 3.35e12)
    hidden = deepspeed.dp_exposed_seconds - (torch.dp_exposed_seconds - copies)
    assert 0.9 * (1 - H100_SHARE) * low <= hidden <= high


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

"""FSDP2's copies around its collectives (PyTorch's ``fully_shard``), priced on the GPU's memory.

Every all-gather's output is split into the unsharded weights (``split_with_sizes_copy``: the
gathered bytes read and written), in each micro-batch's forward and, resharded after forward
(ZeRO-3), in its backward again; each reduction copies the unsharded gradients into the
reduce-scatter's input in the reduce dtype (``chunk_cat``: bf16 read, fp32 written). Megatron-LM
gathers into and reduces out of its contiguous buffers: no copies.

The network here is made too fast to matter (every collective costs nothing), so what the step
still spends on data parallelism is the copies alone; the expected seconds are the kernels' bytes
written out by hand over the preset's HBM at the default calibration's 0.8."""

from __future__ import annotations

import dataclasses

import pytest

from parplan.solver.cluster import Link, make_cluster
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.plan_time import plan_time
from parplan.solver.cost.runtime import Runtime
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.strategy import ParallelConfig

FREE = Link(bandwidth_bytes_per_s=1e30, latency_seconds=0.0)
H100_COPY_BYTES_PER_S = 3.35e12 * 0.8


def _dp_seconds(runtime: Runtime, zero: int, microbatches: int) -> tuple[float, int]:
    """(the step's exposed data-parallel seconds on 8 H100s with a free network, the weights' count)."""
    graph = build_graph(TransformerConfig("llama", "t", 2, 1024, 8, 2816, 4096, 512), batch=2)
    cluster = dataclasses.replace(make_cluster(8, 8, "H100-80GB"), intra_node_override=FREE, inter_node_override=FREE)
    plan = ParallelConfig(dp=8, zero=zero, recompute=Recompute.NONE, micro_batch=2, num_microbatches=microbatches,
                          runtime=runtime)
    stage = plan_time(graph, plan, cluster).stages[0]
    return stage.dp_exposed_seconds, sum(n.numel for n in graph.nodes if n.is_parameter)


@pytest.mark.parametrize("microbatches", [1, 3])
def test_zero3_copies_each_gather_twice_a_micro_batch_and_each_gradient_once_a_step(microbatches: int) -> None:
    seconds, psi = _dp_seconds(Runtime.TORCH, 3, microbatches)
    copy_out = 2 * psi + 2 * psi  # bf16 gathered weights read, bf16 unsharded weights written
    copy_in = 2 * psi + 4 * psi  # bf16 unsharded gradients read, fp32 reduce-scatter input written
    # PyTorch's own trainer accumulates unsharded gradients and reduces once a step
    expected = (2 * microbatches * copy_out + copy_in) / H100_COPY_BYTES_PER_S
    assert seconds == pytest.approx(expected, rel=1e-9)


def test_zero2_gathers_once_a_micro_batch() -> None:
    seconds, psi = _dp_seconds(Runtime.TORCH, 2, 2)
    assert seconds == pytest.approx((2 * 4 * psi + 6 * psi) / H100_COPY_BYTES_PER_S, rel=1e-9)


def test_torchtitan_reduces_every_micro_batch() -> None:
    """torchtitan keeps FSDP2's gradient synchronisation on through gradient accumulation."""
    seconds, psi = _dp_seconds(Runtime.TORCHTITAN, 3, 2)
    assert seconds == pytest.approx((2 * 2 * 4 * psi + 2 * 6 * psi) / H100_COPY_BYTES_PER_S, rel=1e-9)


@pytest.mark.parametrize("zero", [0, 1, 3])
def test_megatron_and_plain_data_parallelism_copy_nothing(zero: int) -> None:
    assert _dp_seconds(Runtime.MEGATRON, zero, 2)[0] == pytest.approx(0.0, abs=1e-15)
    if zero < 2:
        assert _dp_seconds(Runtime.TORCH, zero, 2)[0] == pytest.approx(0.0, abs=1e-15)

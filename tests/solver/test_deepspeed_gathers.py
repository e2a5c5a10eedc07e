"""DeepSpeed ZeRO-3's collectives: buckets of whole tensors, so a tensor as large as a bucket goes in
a collective of its own (rules.data_parallel_collectives). Oracle: the α-β ring formula written out
by hand over the model's parameter tensors."""

from __future__ import annotations

import pytest

from parplan.solver.cluster import Cluster, Link, gpu_preset
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.rules import data_parallel_collectives
from parplan.solver.cost.runtime import DEEPSPEED_BUCKET_ELEMENTS, Runtime
from parplan.solver.evaluate import evaluate
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.models import ModelSource
from parplan.solver.strategy import ParallelConfig


def test_a_tensor_as_large_as_a_bucket_is_one_collective_smaller_ones_share() -> None:
    b = DEEPSPEED_BUCKET_ELEMENTS
    tensors = [9 * b, b, b / 4, b / 4]
    count = data_parallel_collectives(Runtime.DEEPSPEED, 1, 64, 3, tensors, 4, 0.25)
    assert count == pytest.approx(1 + 1 + 0.25 + 0.25)
    # ZeRO 0-2 keep the bucket count of the elements; other gathering runtimes one per unit
    assert data_parallel_collectives(Runtime.DEEPSPEED, 1, 64, 2, tensors, 4, 0.25) == \
        pytest.approx(sum(tensors) / b)
    assert data_parallel_collectives(Runtime.TORCH, 1, 64, 3, tensors, 4, 0.25) == 0.25


def test_zero3_traffic_of_a_large_model_pays_a_ring_latency_per_tensor() -> None:
    """Every matmul weight of this model is as large as a bucket or larger: each pass (the reduction, the
    forward's and the backward's gathers) pays (n − 1) ring steps of latency per such tensor, the
    small tensors (biases, norms) their share of a bucket."""
    n, latency, bandwidth = 8, 1e-3, 100e9  # a slow link makes the latency term count
    cfg = TransformerConfig(family="gpt", name="big-tensors", layers=2, hidden=8192, heads=64, ffn=32768,
                            vocab=8192, seq_len=1024, tied_embeddings=True, dropout=0.0)
    model = ModelSource(cfg.name, config=cfg)
    cluster = Cluster(nodes=1, gpus_per_node=n, gpu=gpu_preset("H100-80GB"),
                      intra_node_override=Link(bandwidth_bytes_per_s=bandwidth, latency_seconds=latency))
    strategy = ParallelConfig(dp=n, zero=3, runtime=Runtime.DEEPSPEED, recompute=Recompute.NONE, micro_batch=1,
                              num_microbatches=1, precision="bf16")
    got = evaluate(model, cluster, strategy, seq_len=1024).time.stages[0].dp_comm_seconds

    graph = model.build(1, 1024)
    tensors = [p.numel for p in graph.nodes if p.is_parameter]
    large = sum(t >= DEEPSPEED_BUCKET_ELEMENTS for t in tensors)
    assert large == 6 * cfg.layers + 1  # q, k, v, out, up, down; the (tied) token embedding
    grad_bytes, weight_bytes = 4, 2  # bf16: fp32 gradients reduced, bf16 weights gathered
    want = 0.0
    for t in tensors:
        count = min(1.0, t / DEEPSPEED_BUCKET_ELEMENTS)
        reduce = (n - 1) / n * t * grad_bytes / bandwidth + (n - 1) * latency * count
        gather = (n - 1) / n * t * weight_bytes / bandwidth + (n - 1) * latency * count
        want += reduce + 2 * gather  # forward and backward gathers of the one micro-batch
    assert got == pytest.approx(want, rel=1e-9)
    # the latency alone: 3 passes x 7 ring steps x 1 ms for each large tensor, at least
    moved = sum((n - 1) / n * t * (grad_bytes + 2 * weight_bytes) / bandwidth for t in tensors)
    assert got - moved >= 3 * (n - 1) * latency * large

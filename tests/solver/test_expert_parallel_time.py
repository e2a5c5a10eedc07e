"""Expert parallelism's token all-to-alls in the step time, against a closed form.

Oracle (GShard / Megatron-LM's all-to-all token dispatcher): each MoE layer sends every rank's
dispatched buffer, ``experts x capacity x hidden`` activations with ``capacity = ceil(tokens x top_k
/ experts x capacity_factor)``, to the ranks holding the experts (dispatch) and the experts' outputs
back (combine), each once in forward and once in backward: four all-to-alls of that buffer over the
``ep`` ranks per layer and micro-batch (a fifth and sixth with full recomputation, which runs the
forward again). In an all-to-all every rank sends ``1/ep`` of its buffer to each peer at once: the
peers on its node over NVLink, the others through its own share of the network (one NIC per GPU),
so a group spanning nodes takes ``(ep - m)/ep`` of the buffer over one GPU's network bandwidth, ``m``
members per node (Megatron-LM's rank order: tensor parallelism innermost, then the expert group).
"""

from __future__ import annotations

import math

import pytest

from parplan.solver.cluster import make_cluster
from parplan.solver.cost.activations import Recompute
from parplan.solver.evaluate import evaluate
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.models import ModelSource
from parplan.solver.strategy import ParallelConfig

SEQ = 512


def _moe(layers: int = 2) -> TransformerConfig:
    return TransformerConfig("mixtral", "moe-test", layers, 1024, 16, 2048, 1000, SEQ, kv_heads=4, num_experts=8,
                             top_k=2)


def _ep_seconds(cfg: TransformerConfig, gpus: int, per_node: int, tp: int, ep: int,
                recompute: Recompute = Recompute.SELECTIVE) -> tuple[float, float]:
    """(expert-parallel, tensor-parallel) seconds of one micro-batch of stage 0."""
    par = ParallelConfig(tp=tp, pp=1, dp=gpus // tp, zero=1, sequence_parallel=tp > 1, micro_batch=1,
                         num_microbatches=2, expert_parallel=ep, recompute=recompute)
    ev = evaluate(ModelSource(cfg.name, config=cfg), make_cluster(gpus, per_node, "H100-80GB"), par, SEQ)
    stage = ev.to_dict()["time"]["stages"][0]
    return stage.get("ep_comm_seconds", 0.0), stage["tp_comm_seconds"]


def _oracle(cfg: TransformerConfig, gpus: int, per_node: int, ep: int, passes: int = 2) -> float:
    cluster = make_cluster(gpus, per_node, "H100-80GB")
    nvlink, nic = cluster.intra_node, cluster.inter_node  # per GPU
    m = min(ep, per_node)  # the expert group's members on one node
    tokens = 1 * SEQ  # one micro-batch of one sample per rank
    capacity = math.ceil(tokens * cfg.top_k / cfg.num_experts * cfg.capacity_factor)
    buffer = cfg.num_experts * capacity * cfg.hidden * 2  # bf16 activations
    local = (m - 1) / ep * buffer / nvlink.bandwidth_bytes_per_s + (m - 1) * nvlink.latency_seconds
    remote = (ep - m) / ep * buffer / nic.bandwidth_bytes_per_s + (ep - m) * nic.latency_seconds
    return cfg.layers * 2 * passes * max(local, remote)


@pytest.mark.parametrize(("gpus", "per_node", "ep"), [(8, 8, 8), (8, 8, 2), (16, 4, 8), (16, 2, 8)])
def test_the_token_all_to_alls_match_the_closed_form_without_tensor_parallelism(gpus: int, per_node: int,
                                                                                 ep: int) -> None:
    cfg = _moe()
    got, tp_seconds = _ep_seconds(cfg, gpus, per_node, tp=1, ep=ep)
    assert tp_seconds == 0.0  # (before the fix the exchange went unpriced without TP)
    assert got == pytest.approx(_oracle(cfg, gpus, per_node, ep), rel=1e-9)
    full, _ = _ep_seconds(cfg, gpus, per_node, tp=1, ep=ep, recompute=Recompute.FULL)
    assert full == pytest.approx(_oracle(cfg, gpus, per_node, ep, passes=3), rel=1e-9)


def test_the_all_to_alls_grow_with_the_layers() -> None:
    one, _ = _ep_seconds(_moe(2), 8, 8, tp=1, ep=1)
    assert one == 0.0
    two, _ = _ep_seconds(_moe(2), 8, 8, tp=1, ep=8)
    four, _ = _ep_seconds(_moe(4), 8, 8, tp=1, ep=8)
    assert four == pytest.approx(2 * two, rel=1e-9) and two > 0


def test_with_tensor_parallelism_the_all_to_alls_run_over_the_expert_group_not_the_tp_link() -> None:
    """tp 2 x ep 4 on nodes of 4: the TP pair is inside a node, the expert group (stride 2) spans two
    nodes, so its all-to-alls cross the network; on nodes of 8 the same group stays on NVLink."""
    cfg = _moe()
    across, tp_across = _ep_seconds(cfg, 8, 4, tp=2, ep=4)
    within, tp_within = _ep_seconds(cfg, 8, 8, tp=2, ep=4)
    assert tp_across == pytest.approx(tp_within, rel=1e-9)  # the TP pair is on NVLink either way
    assert across > 2 * within > 0

"""Step-time model: collective counts against Megatron-LM's known pattern, FLOPs against the
closed-form count of Narayanan et al. (2021), and the pipeline bubble formula."""

from __future__ import annotations

import pytest

from parplan.solver.cluster import make_cluster, ring_link
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.collectives import all_gather_seconds, all_reduce_seconds, reduce_scatter_seconds
from parplan.solver.cost.compute import forward_flops
from parplan.solver.cost.kernels import kernel_spec
from parplan.solver.cost.plan_time import plan_time
from parplan.solver.cost.runtime import Runtime
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.strategy import ParallelConfig, Schedule


def _gpt(layers: int, h: int = 1024, a: int = 16, s: int = 512, v: int = 4096) -> TransformerConfig:
    return TransformerConfig("gpt", "t", layers, h, a, 4 * h, v, s)


def _per_layer_tp_seconds(tp: int, sp: bool) -> float:
    cluster = make_cluster(tp, tp, "A100-80GB")
    cfg = ParallelConfig(tp=tp, sequence_parallel=sp)
    t = [plan_time(build_graph(_gpt(n), batch=2), cfg, cluster).stages[0].tp_comm_seconds for n in (2, 3)]
    return t[1] - t[0]


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_tensor_parallel_layer_does_four_all_reduces(tp: int) -> None:
    """Megatron-LM: 2 all-reduces of the b·s·h activation in forward, 2 in backward, per layer."""
    link = make_cluster(tp, tp, "A100-80GB").intra_node
    nbytes = 2 * 512 * 1024 * 2
    assert _per_layer_tp_seconds(tp, False) == pytest.approx(4 * all_reduce_seconds(tp, nbytes, link))


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_sequence_parallel_layer_does_four_all_gathers_and_four_reduce_scatters(tp: int) -> None:
    link = make_cluster(tp, tp, "A100-80GB").intra_node
    nbytes = 2 * 512 * 1024 * 2
    expected = 4 * (all_gather_seconds(tp, nbytes, link) + reduce_scatter_seconds(tp, nbytes, link))
    assert _per_layer_tp_seconds(tp, True) == pytest.approx(expected)


def test_forward_flops_match_the_closed_form_for_gpt() -> None:
    """Narayanan et al. count 96·b·s·L·h²·(1 + s/(6h) + V/(16·L·h)) for forward + backward +
    recomputation: per layer 24·b·s·h²·(1 + s/(6h)) forward, and the logits 2·b·s·h·V forward
    (not recomputed: 3 x 2bshV = 96bsLh²·V/(16Lh)). Causal attention halves the s/(6h) term.
    Elementwise ops add a little; the model must agree within 1%."""
    b, s, L, h, V = 2, 1024, 8, 2048, 51200
    g = build_graph(TransformerConfig("gpt", "t", L, h, 16, 4 * h, V, s), batch=b)
    total = sum(forward_flops(n, g) for n in g.nodes)
    closed = 24 * b * s * L * h * h * (1 + s / (12 * h)) + 2 * b * s * h * V
    assert total == pytest.approx(closed, rel=0.01)


def test_pipeline_bubble_is_p_minus_1_over_m_for_balanced_stages() -> None:
    """Balanced stages: step = (m + p − 1)·t_stage + tail; GPipe and 1F1B have the same bubble,
    interleaving with v chunks divides it by v."""
    g = build_graph(_gpt(8), batch=1)
    cluster = make_cluster(4, 4, "A100-80GB")
    for schedule, v in ((Schedule.ONE_F_ONE_B, 1), (Schedule.GPIPE, 1), (Schedule.INTERLEAVED, 2)):
        t = plan_time(g, ParallelConfig(pp=4, num_microbatches=8, schedule=schedule, virtual_stages=v), cluster)
        per = [s.microbatch_seconds for s in t.stages]
        tail = max(s.dp_exposed_seconds + s.optimizer_seconds for s in t.stages)
        assert t.step_seconds == pytest.approx(8 * max(per) + (sum(per) - max(per)) / v + tail)


def test_data_parallel_all_reduces_each_layers_fp32_gradients() -> None:
    """The fp32 gradients all-reduced over 16 ranks on two nodes, in Megatron-LM's buckets of
    max(40M, 1M x 16) parameters: the ring's bandwidth term of every byte, and its latency once per
    40M parameters, however the layers group their parameters (the per-layer sums add up to the
    closed form of the whole). The ring has 8 members on each node: 8 NICs carry it (200 GB/s on
    A100 nodes, under NVLink's 300), and 1 of its 15 steps crosses the network."""
    g = build_graph(_gpt(2), batch=1)
    cluster = make_cluster(16, 8, "A100-80GB")
    t = plan_time(g, ParallelConfig(dp=16), cluster)
    users: dict[str, set[str]] = {}
    for n in g.nodes:
        for i in n.inputs:
            if g.node(i).is_parameter:
                users.setdefault(i, set()).add(n.layer or "")
    per_unit: dict[str, int] = {}
    for i, layers in users.items():
        key = "shared" if len(layers) > 1 else next(iter(layers))
        per_unit[key] = per_unit.get(key, 0) + g.node(i).numel
    assert sum(per_unit.values()) == g.parameter_count()
    link = ring_link(16, 2, cluster.intra_node, cluster.inter_node)
    assert link.bandwidth_bytes_per_s == 8 * cluster.inter_node.bandwidth_bytes_per_s
    assert 15 * link.latency_seconds == pytest.approx(14 * cluster.intra_node.latency_seconds
                                                      + cluster.inter_node.latency_seconds)
    elems = sum(per_unit.values())
    total = 4 * elems
    expected = 2 * 15 * (total / (16 * link.bandwidth_bytes_per_s) + link.latency_seconds * elems / 40e6)
    assert t.stages[0].dp_comm_seconds == pytest.approx(expected)


def test_more_devices_more_throughput_for_a_fixed_batch() -> None:
    g = build_graph(_gpt(4), batch=4)
    one = plan_time(g, ParallelConfig(num_microbatches=8), make_cluster(1, 8, "H100-80GB"))
    eight = plan_time(g, ParallelConfig(dp=8, num_microbatches=1), make_cluster(8, 8, "H100-80GB"))
    assert one.tokens_per_step == eight.tokens_per_step
    assert eight.tokens_per_second > 4 * one.tokens_per_second


@pytest.mark.parametrize(("runtime", "kernel", "rebuilt"), [
    (Runtime.MEGATRON, "fused", True),  # Megatron-Core checkpoints core attention whatever its backend
    (Runtime.TORCH, "sdpa", True),  # the agent's model checkpoints its attention core alike
    (Runtime.TORCHTITAN, "sdpa", False),  # torchtitan's export runs selective as no checkpointing
    (Runtime.DEEPSPEED, "sdpa", False),  # DeepSpeed leaves checkpointing to the user's model
])
def test_selective_recomputation_reruns_a_flash_core_where_the_runtime_checkpoints_it(
        runtime: Runtime, kernel: str, rebuilt: bool) -> None:
    """Selective recomputation with flash attention costs, per micro-batch, the causal attention
    core's forward once more per layer, ``2·b·s²·h`` FLOPs (QKᵀ and PV over half the pairs) at the
    kernel's fraction of the H100's dense bf16 peak, in the runtimes that checkpoint the core; none
    in the others. (s = 4096, h = 1024: the kernel is far from its memory bound.)"""
    b, s, h, layers = 1, 4096, 1024, 2
    g = build_graph(TransformerConfig("gpt", "t", layers, h, 8, 4 * h, 4096, s), batch=b)
    cluster = make_cluster(1, 1, "H100-80GB")
    spec = kernel_spec(cluster.gpu)
    assert spec is not None

    def step(recompute: Recompute) -> float:
        return plan_time(g, ParallelConfig(recompute=recompute, runtime=runtime), cluster).step_seconds

    efficiency = spec.attention[kernel].efficiency(False, h // 8, s)  # the forward's, 8 heads of 128
    expected = layers * 2 * b * s * s * h / (cluster.gpu.peak_flops["bf16"] * efficiency)
    assert step(Recompute.SELECTIVE) - step(Recompute.NONE) == pytest.approx(expected if rebuilt else 0.0,
                                                                              rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("preset", ["gpt-1.7b", "llama-3-8b", "mixtral-8x7b"])
@pytest.mark.parametrize(("tp", "sp", "zero"), [(1, False, 0), (2, True, 1), (2, False, 3)])
def test_the_searches_offer_no_recomputation_where_selective_saves_nothing(preset: str, tp: int, sp: bool,
                                                                         zero: int) -> None:
    """Megatron-LM with flash attention: selective recomputation keeps exactly the buffers no
    recomputation keeps (a flash kernel keeps no scores) and only adds the core's forward, so the
    searches offer none in its place; without flash, or in the torch runtime, whose repeated K and V
    selective recomputation drops, they still offer selective."""
    from parplan.solver.cost.plan_memory import plan_memory
    from parplan.solver.cost.rules import search_recomputes
    from parplan.solver.frontends.presets import get_preset

    cfg = get_preset(preset).with_(layers=2, seq_len=1024)
    g = build_graph(cfg, batch=1)
    cluster = make_cluster(4, 4, "H100-80GB")

    def priced(rc: Recompute) -> tuple[list[float], float]:
        par = ParallelConfig(tp=tp, dp=4 // tp, zero=zero, sequence_parallel=sp, recompute=rc)
        return ([s.peak_bytes for s in plan_memory(g, par).stages],
                plan_time(g, par, cluster).step_seconds)

    (none_mem, none_t), (sel_mem, sel_t) = priced(Recompute.NONE), priced(Recompute.SELECTIVE)
    assert none_mem == sel_mem and none_t < sel_t
    assert search_recomputes(Runtime.MEGATRON, True) == (Recompute.NONE, Recompute.FULL)
    assert search_recomputes(Runtime.MEGATRON, False, full=False) == (Recompute.SELECTIVE,)
    assert search_recomputes(Runtime.TORCH, True)[0] is Recompute.SELECTIVE

"""Context parallelism (ring attention, Megatron-LM's --context-parallel-size) against closed forms,
brute force and the cp = 1 model.

Oracles: Korthikanti et al.'s per-layer activation bytes divided by the CP degree (every rank holds
1/cp of the tokens); the ZeRO paper's model-state bytes with the data-parallel group taken as
dp x cp (Megatron-LM's gradient buffers and distributed optimizer use the data-and-context-parallel
group); the ring's transfers written out; every per-layer assignment of a small case, evaluated by
the cost model, against the DP search's answer.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Any

import pytest

from parplan.solver.calibration import DEFAULT_CALIBRATION
from parplan.solver.cluster import Link, make_cluster
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.context_parallel import all_to_all_exchange, ring_exchange
from parplan.solver.cost.plan_evaluator import LayerPlan, PlanEvaluator
from parplan.solver.cost.plan_memory import plan_memory
from parplan.solver.cost.plan_time import plan_time
from parplan.solver.cost.precision import get_precision
from parplan.solver.cost.runtime import Runtime
from parplan.solver.cost.unit_strategy import UnitStrategy
from parplan.solver.cost.units import GraphCosts
from parplan.solver.dp.search import search
from parplan.solver.dp.space import SpaceOptions, context_degrees, layer_strategies
from parplan.solver.errors import StrategyError
from parplan.solver.evaluate import evaluate
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.frontends.presets import get_preset
from parplan.solver.models import ModelSource
from parplan.solver.planner import solve
from parplan.solver.request import parse_plan_request
from parplan.solver.strategy import ParallelConfig

GIB = 2**30


def _gpt(layers: int, hidden: int, heads: int, seq: int) -> TransformerConfig:
    return TransformerConfig("gpt", "gpt-test", layers, hidden, heads, 4 * hidden, 512, seq)


def _per_layer_activation_bytes(cfg: TransformerConfig, b: int, par: ParallelConfig) -> float:
    """Activation bytes of one transformer layer: the difference between L+1 and L layers."""
    small = plan_memory(build_graph(cfg, batch=b), par).stages[0].activation_bytes_per_microbatch
    large = plan_memory(build_graph(cfg.with_(layers=cfg.layers + 1), batch=b), par)
    return large.stages[0].activation_bytes_per_microbatch - small


@pytest.mark.parametrize("cp", [2, 4, 8])
@pytest.mark.parametrize(("t", "sp", "recompute", "flash", "formula"), [
    (1, False, Recompute.NONE, False, lambda s, b, h, a, t: s * b * h * (34 + 5 * a * s / h)),
    (4, False, Recompute.NONE, False, lambda s, b, h, a, t: s * b * h * (10 + 24 / t + 5 * a * s / (h * t))),
    (4, True, Recompute.NONE, False, lambda s, b, h, a, t: s * b * h / t * (34 + 5 * a * s / h)),
    (4, True, Recompute.SELECTIVE, True, lambda s, b, h, a, t: s * b * h / t * 34),
    (2, False, Recompute.SELECTIVE, True, lambda s, b, h, a, t: s * b * h * (10 + 24 / t)),
])
def test_activations_are_korthikantis_divided_by_cp(cp: int, t: int, sp: bool, recompute: Recompute, flash: bool,
                                                   formula: Any) -> None:
    s, b, a, h = 256, 2, 8, 256
    par = ParallelConfig(tp=t, sequence_parallel=sp, recompute=recompute, flash_attention=flash, cp=cp)
    expected = formula(s, b, h, a, t) / cp
    assert _per_layer_activation_bytes(_gpt(2, h, a, s), b, par) == pytest.approx(expected, rel=1e-12)


def test_full_recompute_keeps_the_layer_input_2sbh_over_cp() -> None:
    s, b, a, h, cp = 256, 2, 8, 256, 4
    par = ParallelConfig(recompute=Recompute.FULL, cp=cp)
    assert _per_layer_activation_bytes(_gpt(2, h, a, s), b, par) == pytest.approx(2 * s * b * h / cp, rel=1e-12)


@pytest.mark.parametrize(("zero", "bytes_per_param"), [
    (0, lambda n: 16),                  # no sharding: 2 weight + 2 grad + 12 fp32 master/m/v
    (1, lambda n: 4 + 12 / n),          # ZeRO-1: 4Ψ + 12Ψ/N_d
    (2, lambda n: 2 + 14 / n),          # ZeRO-2: 2Ψ + 14Ψ/N_d
    (3, lambda n: 16 / n),              # ZeRO-3: 16Ψ/N_d
])
@pytest.mark.parametrize(("dp", "cp"), [(1, 4), (2, 2), (4, 8)])
def test_model_states_are_the_zero_table_with_n_d_dp_times_cp(zero: int, bytes_per_param: Any, dp: int,
                                                              cp: int) -> None:
    graph = build_graph(get_preset("gpt-1.7b"), batch=1, seq_len=256)
    par = ParallelConfig(dp=dp, cp=cp, zero=zero, precision="bf16-grad16")
    held = plan_memory(graph, par).stages[0].memory.bytes.model_states
    assert held == pytest.approx(bytes_per_param(dp * cp) * graph.parameter_count(), rel=1e-12)


def test_ring_exchange_hides_transfers_shorter_than_a_step_of_attention() -> None:
    link = Link(bandwidth_bytes_per_s=1e9, latency_seconds=0.0)
    chunk = 1e6  # 1 ms per forward transfer, 2 ms backward (K, V and their gradients)
    fast = ring_exchange(4, chunk, forward_seconds=0.008, backward_seconds=0.016, link=link)
    assert fast.exposed_seconds == 0.0
    assert fast.traffic_seconds == pytest.approx(3 * (1e-3 + 2e-3))
    slow = ring_exchange(4, chunk, forward_seconds=0.002, backward_seconds=0.004, link=link)
    # per step: 1 ms - 0.5 ms exposed forward, 2 ms - 1 ms backward; cp - 1 = 3 steps
    assert slow.exposed_seconds == pytest.approx(3 * (0.5e-3 + 1e-3))
    again = ring_exchange(4, chunk, forward_seconds=0.002, backward_seconds=0.004, link=link, recomputed=True)
    assert again.exposed_seconds == pytest.approx(3 * (2 * 0.5e-3 + 1e-3))
    assert ring_exchange(1, chunk, 0.0, 0.0, link).traffic_seconds == 0.0


def test_all_to_all_exchange_is_four_all_to_alls_each_way_not_hidden() -> None:
    """(n - 1)/n of each rank's q, k and v, and of its output, each way (latency apart)."""
    link = Link(bandwidth_bytes_per_s=1e9, latency_seconds=0.0)
    q, kv, out = 4e6, 2e6, 4e6
    one_way = 3 / 4 * (q + kv + out) / 1e9
    ex = all_to_all_exchange(4, q, kv, out, link)
    assert ex.exposed_seconds == ex.traffic_seconds == pytest.approx(2 * one_way)
    assert all_to_all_exchange(4, q, kv, out, link, recomputed=True).exposed_seconds == pytest.approx(3 * one_way)


def test_all_to_all_saves_what_the_ring_saves_and_buffers_q_kv_and_out() -> None:
    """The head split holds as many bytes as the sequence split: activations as the ring's; its
    buffers are re-laid q, k, v and the output's gradient (16-bit), the ring's four K/V chunks."""
    cfg = get_preset("llama-3-8b").with_(layers=2)
    s, cp, t = 16384, 4, 2
    graph = build_graph(cfg, batch=1, seq_len=s)
    gc = GraphCosts(graph)
    prec = get_precision("bf16")
    ring = gc.unit_cost("layers.0", UnitStrategy(tp=t, cp=cp), prec)
    a2a = gc.unit_cost("layers.0", UnitStrategy(tp=t, cp=cp, cp_comm="a2a"), prec)
    assert a2a.act_bytes == ring.act_bytes
    q = out = (s // cp) * (cfg.heads // t) * cfg.d_head * 2
    kv = 2 * (s // cp) * (cfg.n_kv_heads // t) * cfg.d_head * 2
    assert a2a.cp_buffer_bytes == pytest.approx(q + kv + out)
    assert ring.cp_buffer_bytes == pytest.approx(4 * kv)
    with pytest.raises(StrategyError, match="tp x cp = 16"):
        plan_memory(graph, ParallelConfig(tp=4, cp=4, cp_comm="a2a"))  # 8 key/value heads


def test_compute_of_every_operator_is_split_over_cp() -> None:
    """Long sequences are compute bound: the forward and backward seconds of a stage are cp = 1's / cp,
    up to the GEMMs' tile and wave quantisation on the shorter sequence (kernels.shape_factor) and the
    flash kernel's fixed work per block of queries, which each ring step pays over 8,192 keys instead
    of 32,768 (Transformer Engine's backward on Hopper: 0.916 of its ceiling instead of 0.978; here the
    stage's backward 2.4 % over a quarter)."""
    cfg = get_preset("llama-3-8b").with_(layers=2)
    graph = build_graph(cfg, batch=1, seq_len=32768)
    cluster = make_cluster(8, 8, "H100-80GB")
    gc = GraphCosts(graph)
    one = plan_time(graph, ParallelConfig(tp=1, dp=8), cluster, costs=gc).stages[0]
    four = plan_time(graph, ParallelConfig(tp=1, dp=2, cp=4), cluster, costs=gc).stages[0]
    assert four.forward_seconds == pytest.approx(one.forward_seconds / 4, rel=0.02)
    assert one.backward_seconds / 4 <= four.backward_seconds <= one.backward_seconds / 4 * 1.03


def test_ring_buffers_are_temporaries_of_the_attention() -> None:
    """Backward of one attention holds 4 chunks of K and V beyond the cp = 1 layout's shares: two
    travelling K/V chunks and two of their gradients (16-bit, the rank's kv heads over TP)."""
    cfg = get_preset("llama-3-8b").with_(layers=2)
    s, cp, t = 16384, 4, 2
    graph = build_graph(cfg, batch=1, seq_len=s)
    gc = GraphCosts(graph)
    cost = gc.unit_cost("layers.0", UnitStrategy(tp=t, cp=cp), get_precision("bf16"))
    chunk = 2 * (s // cp) * (cfg.n_kv_heads // t) * cfg.d_head * 2  # K and V, bf16
    assert cost.cp_buffer_bytes == pytest.approx(4 * chunk)


def test_cp_needs_the_sequence_to_split_into_2cp_chunks_and_self_attention() -> None:
    graph = build_graph(_gpt(2, 256, 8, 96), batch=1)
    with pytest.raises(StrategyError, match="2 x cp"):
        plan_memory(graph, ParallelConfig(cp=64))
    t5 = build_graph(get_preset("t5-11b").with_(layers=1, decoder_layers=1), batch=1, seq_len=64)
    with pytest.raises(StrategyError, match="self-attention"):
        plan_memory(t5, ParallelConfig(cp=2))


def test_cp_degrees_offered_are_powers_of_two_with_enough_tokens_per_rank() -> None:
    opts = SpaceOptions(max_cp=32, cp_min_tokens=4096)
    assert context_degrees(64, 131072, opts) == [1, 2, 4, 8, 16, 32]
    assert context_degrees(8, 131072, opts) == [1, 2, 4, 8]
    assert context_degrees(1024, 8192, opts) == [1, 2]
    assert context_degrees(1024, 2048, opts) == [1]


def test_dp_search_with_cp_equals_brute_force_over_per_layer_assignments() -> None:
    """Two layers on 4 devices, one sample per micro-batch (so DP cannot split the batch further) at
    a sequence long enough that CP matters: every assignment of the decision tree's strategies
    (every CP degree, one per plan) evaluated by the cost model, against the DP search's answer."""
    cfg = TransformerConfig("llama", "tiny-long", 2, 256, 8, 1024, 4096, 4096)
    cluster = make_cluster(4, 4, "A100-80GB")
    graph_for = lambda b: build_graph(cfg, batch=b)  # noqa: E731
    ev = PlanEvaluator(functools.cache(lambda b: GraphCosts(graph_for(b))), cluster, DEFAULT_CALIBRATION)
    # ZeRO-3 left out: the DP's tables bound its gathered weights and gradients per block from above
    # (stage_memory.unit_temporary_bytes), so at a tight budget they exclude plans that the whole-plan
    # walk finds fitting: that bound, not CP, would be what the comparison measured
    opts = SpaceOptions(zero_stages=(0, 1, 2), checkpointing=False, sequence_parallel="never", both_orders=False,
                        max_cp=4, cp_min_tokens=512)
    blocks = [f"layers.{i}" for i in range(2)]
    plans = []
    for cp in context_degrees(4, 4096, opts):
        # selective recomputation too, which the search replaces by none (same buffers, less time)
        strats = [s for light in (Recompute.NONE, Recompute.SELECTIVE)
                  for s in layer_strategies(4, opts, cp=cp, light=light) if s.dp == 1]
        for combo in itertools.product(strats, repeat=2):
            plans.append(LayerPlan(pp=1, num_microbatches=2, global_batch=2,
                                   layers=dict(zip(blocks, combo, strict=True))))
    assert {next(iter(p.layers.values())).cp for p in plans} == {1, 2, 4}
    assert {s.cp_comm for p in plans for s in p.layers.values()} == {"p2p", "a2a"}
    peaks = {id(p): ev.memory(p).peak_bytes for p in plans}
    no_cp = min(peaks[id(p)] for p in plans if next(iter(p.layers.values())).cp == 1)
    with_cp = min(peaks[id(p)] for p in plans if next(iter(p.layers.values())).cp > 1)
    libs = Runtime.MEGATRON.library_workspace_bytes  # the libraries' workspaces: the same under any CP
    assert with_cp - libs < 0.9 * (no_cp - libs)
    budget = 0.99 * no_cp  # nothing without CP fits
    best = min((ev.time(p).step_seconds for p in plans if peaks[id(p)] <= budget), default=math.inf)
    assert math.isfinite(best)
    res = search(graph_for, cluster, global_batch=2, objective="max-throughput", budget_bytes=budget,
                 max_slowdown=0.1, alpha_gib_per_s=None, calibration=DEFAULT_CALIBRATION, options=opts,
                 pp_choices=[1], m_choices=[2])
    assert res.status == "optimal"
    assert res.peak_bytes <= budget
    assert all(s.cp > 1 for s in res.plan.layers.values())
    assert res.step_seconds >= best - 1e-12
    # the DP rounds memory up to 1/512 of the budget, so it may only lose by that rounding
    lenient = min(ev.time(p).step_seconds for p in plans if peaks[id(p)] <= budget * (1 - 8 / 512))
    assert res.step_seconds <= lenient + 1e-12


def test_the_galvatron_target_plans_without_cp_where_target_any_uses_it() -> None:
    """Galvatron has no ring attention: its target's per-layer search leaves CP out, at a sequence
    where the unrestricted search takes it."""
    def plan(target: str) -> dict[str, Any]:
        return solve(parse_plan_request({"model": {"preset": "llama-3-8b"},
                                         "cluster": {"gpus": 8, "gpu": "H100-80GB"},
                                         "training": {"global_batch": 2, "seq_len": 65536},
                                         "search": "dp", "target": target}))

    assert plan("any")["strategy"]["cp"] > 1
    galvatron = plan("galvatron")
    assert galvatron["strategy"]["cp"] == 1 and all(r["cp"] == 1 for r in galvatron["strategy"]["layers"])


def _a2a_oracle(cfg: TransformerConfig, seq: int, cp: int, per_node: int, gpus_per_node: int) -> float:
    """One micro-batch's all-to-all exchange of stage 0, written out: every attention sends q, k, v
    and the output (one sample, bf16) once forward and once backward; each rank keeps 1/cp of
    every buffer, sends (m - 1)/cp over NVLink to its node's m members and (cp - m)/cp through its
    own network card, the two at once."""
    cluster = make_cluster(cp * 2, gpus_per_node, "H100-80GB")
    nvlink, nic = cluster.intra_node, cluster.inter_node
    m = min(cp, per_node)
    q = out = (seq // cp) * cfg.heads * cfg.d_head * 2
    kv = 2 * (seq // cp) * cfg.n_kv_heads * cfg.d_head * 2
    one = 0.0
    for b in (q, kv, out):
        local = (m - 1) / cp * b / nvlink.bandwidth_bytes_per_s + (m - 1) * nvlink.latency_seconds
        remote = (cp - m) / cp * b / nic.bandwidth_bytes_per_s + (cp - m) * nic.latency_seconds
        one += max(local, remote)
    return cfg.layers * 2 * one


@pytest.mark.parametrize(("gpus_per_node", "per_node"), [(8, 8), (4, 4), (2, 2)])
def test_all_to_all_exchange_across_nodes_goes_through_each_gpus_network_share(gpus_per_node: int,
                                                                               per_node: int) -> None:
    """CP 8 (all-to-all) on 16 GPUs, data parallel 2 outside it: inside a node, or spread over two
    or four nodes. A ring's link would give the group every network card of its nodes."""
    cfg = get_preset("llama-3-8b").with_(layers=2)
    seq, cp = 16384, 8
    par = ParallelConfig(tp=1, pp=1, dp=2, cp=cp, cp_comm="a2a", zero=1, micro_batch=1, num_microbatches=1,
                         recompute=Recompute.NONE)
    ev = evaluate(ModelSource(cfg.name, config=cfg), make_cluster(2 * cp, gpus_per_node, "H100-80GB"), par, seq)
    got = ev.to_dict()["time"]["stages"][0]["cp_comm_seconds"]
    assert got == pytest.approx(_a2a_oracle(cfg, seq, cp, per_node, gpus_per_node), rel=1e-9)

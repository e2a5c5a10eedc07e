"""Megatron-LM's overlap options (``--tp-comm-overlap``, ``--overlap-param-gather``) priced as what
they hide: communication under compute that runs anyway, never more than that compute lasts, never
more than the communication itself. Bounds from closed forms (ring all-gather), not from the model."""

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
from parplan.solver.ir import Graph
from parplan.solver.strategy import ParallelConfig


def _graph(batch: int = 1, h: int = 2048) -> Graph:
    return build_graph(TransformerConfig("gpt", "t", 16, h, 16, 4 * h, 32000, 1024), batch=batch)


@pytest.mark.parametrize(("gpus_per_node", "batch"), [(8, 1), (8, 8), (1, 1), (1, 8)])
def test_tp_comm_overlap_hides_tp_collectives_at_most_for_the_compute(gpus_per_node: int, batch: int) -> None:
    g = _graph(batch)
    cluster = make_cluster(8, gpus_per_node, "H100-80GB")
    plain = plan_time(g, ParallelConfig(tp=8, sequence_parallel=True), cluster)
    over = plan_time(g, ParallelConfig(tp=8, sequence_parallel=True, tp_comm_overlap=True), cluster)
    p, o = plain.stages[0], over.stages[0]
    compute = p.forward_seconds + p.backward_seconds + p.recompute_seconds
    assert (o.forward_seconds, o.backward_seconds, o.dp_exposed_seconds) == \
        (p.forward_seconds, p.backward_seconds, p.dp_exposed_seconds)
    assert o.tp_comm_seconds < p.tp_comm_seconds  # the GEMMs hide some
    assert o.tp_comm_seconds >= max(0.0, p.tp_comm_seconds - compute) - 1e-12  # no more than compute lasts
    assert plain.step_seconds - over.step_seconds == pytest.approx(p.tp_comm_seconds - o.tp_comm_seconds)


def test_tp_comm_overlap_leaves_more_exposed_across_nodes_than_within() -> None:
    g = _graph(8)
    cfg = ParallelConfig(tp=8, sequence_parallel=True, tp_comm_overlap=True)
    within = plan_time(g, cfg, make_cluster(8, 8, "H100-80GB")).stages[0].tp_comm_seconds
    across = plan_time(g, cfg, make_cluster(8, 1, "H100-80GB")).stages[0].tp_comm_seconds
    assert across > within


def test_overlap_param_gather_hides_at_most_the_gather_and_one_forward() -> None:
    """16 nodes of one GPU: every ring step crosses one 50 GB/s NIC (the H100 preset's), 8 us."""
    g = _graph()
    cluster = make_cluster(16, 1, "H100-80GB")
    plain = plan_time(g, ParallelConfig(dp=16, zero=1), cluster)
    over = plan_time(g, ParallelConfig(dp=16, zero=1, overlap_param_gather=True), cluster)
    p, o = plain.stages[0], over.stages[0]
    assert o.dp_comm_seconds == p.dp_comm_seconds  # the same bytes move
    saved = p.dp_exposed_seconds - o.dp_exposed_seconds
    n, psi = 16, sum(x.numel for x in g.nodes if x.is_parameter)
    # ring all-gather of the bf16 weights, a latency per step of every 40M-parameter bucket (and one more)
    gather = (n - 1) / n * 2 * psi / 50e9 + (n - 1) * 8e-6 * (psi / 40e6 + 1)
    assert 0 < saved <= min(gather, p.forward_seconds) + 1e-12
    assert plain.step_seconds - over.step_seconds == pytest.approx(saved)


@pytest.mark.parametrize("kwargs", [
    {"tp": 2, "tp_comm_overlap": True},  # no sequence parallelism
    {"tp": 2, "sequence_parallel": True, "tp_comm_overlap": True, "runtime": Runtime.TORCH},
    {"dp": 2, "overlap_param_gather": True},  # no distributed optimizer
    {"dp": 2, "zero": 3, "overlap_param_gather": True},
])
def test_overlap_options_need_what_megatron_needs(kwargs: dict[str, object]) -> None:
    with pytest.raises(StrategyError):
        ParallelConfig(**kwargs)  # type: ignore[arg-type]


def test_a_layer_plan_whose_blocks_cannot_use_its_overlap_is_refused() -> None:
    """The per-layer plans the evaluator prices are checked as the uniform strategy is: a block
    without sequence parallelism cannot run Transformer Engine's TP overlap."""
    g = _graph()
    plan = layer_plan(g, ParallelConfig(tp=2, sequence_parallel=True, tp_comm_overlap=True))
    bad = dataclasses.replace(plan, layers={u: dataclasses.replace(s, sp=False) for u, s in plan.layers.items()})
    evaluator = shared_evaluator(GraphCosts(g), make_cluster(2, 2, "H100-80GB"))
    assert evaluator.time(plan).step_seconds > 0
    with pytest.raises(StrategyError, match="sequence parallelism"):
        evaluator.time(bad)


def test_planned_megatron_plans_gather_the_optimizers_weights_under_the_next_forward() -> None:
    """The uniform search and the baselines run Megatron-LM's distributed optimizer (ZeRO-1 over
    more than one rank) with ``--overlap-param-gather``: the same bytes as without it, the weight
    gather hidden (the step shorter by exactly that), and the export passes the flag on."""
    from parplan.exports import export_plan
    from parplan.solver.baselines import Candidate, UniformEvaluator
    from parplan.solver.cost.activations import Recompute
    from parplan.solver.cost.plan_memory import plan_memory
    from parplan.solver.planner import solve
    from parplan.solver.request import parse_plan_request
    from parplan.solver.strategy import Schedule

    req = parse_plan_request({"model": {"preset": "llama-3-8b"},
                              "cluster": {"gpus": 16, "gpus_per_node": 8, "gpu": "H100-80GB"},
                              "training": {"global_batch": 64, "seq_len": 4096}, "target": "megatron"})
    doc = solve(req)
    s = doc["strategy"]
    assert (s["zero"], s["overlap_param_gather"]) == (1, True) and s["dp"] > 1
    assert doc["baselines"]["megatron"]["strategy"]["overlap_param_gather"] is (
        doc["baselines"]["megatron"]["strategy"]["zero"] == 1)
    ev = UniformEvaluator(req.model, req.cluster, req.global_batch, req.seq_len, req.calibration)
    c = Candidate(s["tp"], s["pp"], s["dp"], s["zero"], s["sequence_parallel"], Recompute(s["recompute"]),
                  s["micro_batch"], Schedule(s["schedule"]), s["virtual_stages"], s["expert_parallel"])
    over = ev.config(c)
    plain = dataclasses.replace(over, overlap_param_gather=False)
    g, costs = ev.graph(c.micro_batch), ev.costs(c.micro_batch)
    t_over, t_plain = plan_time(g, over, req.cluster, req.calibration, costs), plan_time(g, plain, req.cluster,
                                                                                          req.calibration, costs)
    assert doc["time"]["step_seconds"] == pytest.approx(t_over.step_seconds, rel=1e-12)
    assert plan_memory(g, over, costs).peak_bytes == plan_memory(g, plain, costs).peak_bytes
    hidden = t_plain.stages[0].dp_exposed_seconds - t_over.stages[0].dp_exposed_seconds
    assert hidden > 0 and t_plain.step_seconds - t_over.step_seconds == pytest.approx(hidden)
    assert "--overlap-param-gather" in export_plan(doc, "megatron").files["megatron_args.txt"].splitlines()
    # only the distributed optimizer over several ranks, and only Megatron-LM's
    assert not ev.config(dataclasses.replace(c, zero=0)).overlap_param_gather
    assert not UniformEvaluator(req.model, req.cluster, req.global_batch, req.seq_len,
                                runtime=Runtime.DEEPSPEED).config(c).overlap_param_gather

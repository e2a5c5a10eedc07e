"""Megatron-LM's expert tensor-parallel size (``--expert-tensor-parallel-size``, ``etp``) beside the
tensor-parallel size, against closed forms written from megatron-core's sharding rules.

Oracle (megatron/core/parallel_state.py, ``initialize_model_parallel``'s expert rank generator; the
MoE layer's ``TEGroupedMLP``/``SequentialMLP`` on the expert tensor-parallel group;
``token_dispatcher.py``'s ``MoEAlltoAllTokenDispatcher``): a stage's ``tp x dp x cp`` ranks regrouped
as ``etp x ep x expert-dp``. Each rank holds ``E / ep`` experts, each expert's hidden units split over
``etp``: ``N_exp / (ep x etp)`` expert parameters, their fp32 main gradients and, without the
distributed optimizer, their fp32 master weight and two Adam moments (12 bytes); with it (ZeRO-1) the
optimizer states sharded over the expert-data-parallel group of ``tp x dp x cp / (etp x ep)``
ranks. Tokens: each rank dispatches its own sequence-parallel share (``tokens / tp``), receives as
many over the expert group, then all-gathers over the expert tensor-parallel group: ``etp / tp`` of
the TP group's tokens, ``top_k`` slots each, their hidden units over ``etp``.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from parplan.imports.megatron import read_megatron_args
from parplan.solver.cost.plan_memory import plan_memory
from parplan.solver.cost.unit_strategy import UnitStrategy, local_elems
from parplan.solver.errors import StrategyError
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.ir import Graph
from parplan.solver.strategy import ParallelConfig

SEQ, E, TOP_K, H, F, LAYERS = 256, 8, 2, 512, 1024, 2


def _graph() -> Graph:
    cfg = TransformerConfig("mixtral", "moe-test", LAYERS, H, 8, F, 1000, SEQ, kv_heads=4, num_experts=E, top_k=TOP_K)
    return build_graph(cfg, batch=1, seq_len=SEQ)


#: the routed experts' weights (SwiGLU: gate, up and down, ``h x f`` each), all layers
N_EXP = LAYERS * E * 3 * H * F


def _states(tp: int, dp: int, ep: int, etp: int | None, zero: int) -> tuple[float, float, float]:
    cfg = ParallelConfig(tp=tp, dp=dp, zero=zero, sequence_parallel=True, expert_parallel=ep,
                         expert_tensor_parallel=etp)
    b = plan_memory(_graph(), cfg).stages[0].memory.bytes
    return b.parameters, b.gradients, b.optimizer_states


@pytest.mark.parametrize("ep", [2, 4])
@pytest.mark.parametrize("etp", [1, 2])
def test_expert_weights_gradients_and_states_per_rank_follow_etp(ep: int, etp: int) -> None:
    """Without the distributed optimizer: ETP's share against TP's (tp 4) is the closed form's
    ``N_exp / (ep x etp) - N_exp / (ep x tp)`` expert elements, at 2 + 4 + 12 bytes (the router and
    the dense layers are the same under both)."""
    tp = 4
    base = _states(tp, 8, ep, None, 0)
    split = _states(tp, 8, ep, etp, 0)
    more = N_EXP / (ep * etp) - N_EXP / (ep * tp)
    for got, ref, per in zip(split, base, (2, 4, 12), strict=True):
        assert got - ref == pytest.approx(per * more, rel=1e-12)


@pytest.mark.parametrize(("tp", "dp", "etp"), [(2, 4, 1), (4, 2, 1), (4, 2, 2)])
def test_the_distributed_optimizer_shards_expert_states_over_expert_data_parallel(tp: int, dp: int,
                                                                                   etp: int) -> None:
    """ZeRO-1: a rank's expert states are ``12 N_exp / (ep x etp x expert-dp)`` = ``12 N_exp / (tp x dp)``
    whatever ``etp`` (ep 1, so that the router is a dense weight in both), the same as the experts on
    TP; an expert-dp of ``dp`` alone would hold ``tp / etp`` times more."""
    ref = _states(tp, dp, 1, None, 1)[2]
    got = _states(tp, dp, 1, etp, 1)[2]
    assert got == pytest.approx(ref, rel=1e-12)
    wrong = 12 * N_EXP / (etp * dp) - 12 * N_EXP / (tp * dp)  # sharded over dp only: it can fail
    assert abs(got - ref) < 1e-6 * wrong


@pytest.mark.parametrize(("tp", "ep", "etp"), [(2, 2, 1), (2, 4, 1), (4, 2, 2), (4, 2, 1)])
def test_a_rank_holds_etp_over_tp_of_its_groups_tokens(tp: int, ep: int, etp: int) -> None:
    graph = _graph()
    s = UnitStrategy(tp=tp, sp=True, ep=ep, etp=etp)
    capacity = math.ceil(SEQ * TOP_K / E)
    tokens = E * capacity  # the TP group's token slots (one micro-batch of one sample)
    assert local_elems(graph.node("layers.0.moe.dispatch"), s) == tokens * etp / tp * H
    assert local_elems(graph.node("layers.0.moe.experts.act"), s) == tokens * etp / tp * F / etp
    assert local_elems(graph.node("layers.0.moe.experts.down.weight"), s) == E / ep * F / etp * H
    assert local_elems(graph.node("layers.0.moe.router"), s) == local_elems(
        graph.node("layers.0.moe.router"), UnitStrategy(tp=tp, sp=True, ep=ep))  # the router's are not experts'


def test_megatron_lm_refusals_are_named() -> None:
    """Megatron-LM's own condition (``etp x ep`` divides ``tp x dp x cp``) and what parplan does not model."""
    with pytest.raises(StrategyError, match="must divide tp x dp x cp"):
        ParallelConfig(tp=2, dp=3, sequence_parallel=True, expert_parallel=1, expert_tensor_parallel=4)
    with pytest.raises(StrategyError, match="does not divide tp"):
        ParallelConfig(tp=2, dp=4, sequence_parallel=True, expert_tensor_parallel=4)
    with pytest.raises(StrategyError, match="without sequence parallelism"):
        ParallelConfig(tp=2, dp=4, expert_parallel=2, expert_tensor_parallel=1)
    # an expert group of 4 ranks across TP groups of 2: Megatron-LM's ep need not divide dp then
    assert ParallelConfig(tp=4, dp=1, pp=2, sequence_parallel=True, expert_parallel=2,
                          expert_tensor_parallel=2).mesh()["ep"] == 1
    assert ParallelConfig(tp=2, dp=2, sequence_parallel=True, expert_parallel=2,
                          expert_tensor_parallel=2).expert_tensor_parallel is None  # = tp: one spelling


CI = """--num-layers 12 --hidden-size 512 --num-attention-heads 8 --seq-length 1024 --max-position-embeddings 1024
--micro-batch-size 4 --global-batch-size 32 --tensor-model-parallel-size 4 --pipeline-model-parallel-size 2
--expert-model-parallel-size 2 --expert-tensor-parallel-size 2 --num-experts 8 --moe-router-topk 2
--moe-token-dispatcher-type alltoall --sequence-parallel --use-distributed-optimizer --bf16 --vocab-size 8192"""


def test_megatron_lms_ci_flags_are_read_into_the_strategy() -> None:
    """Megatron-LM's CI case moe/gpt3_moe_mcore_te_tp4_ep2_etp2_pp2 (8 GPUs: dp 1, an expert group
    of two TP ranks' halves) reads as it ran."""
    got = read_megatron_args(CI, gpus=8)
    s = got.strategy
    assert (s.tp, s.pp, s.dp, s.expert_parallel, s.expert_tensor_parallel) == (4, 2, 1, 2, 2)
    assert plan_memory(got.model.build(4, 1024), s).stages[0].memory.bytes.total > 0
    dense = read_megatron_args(CI.replace("--num-experts 8 --moe-router-topk 2", "").replace(
        "--moe-token-dispatcher-type alltoall", "").replace("--expert-model-parallel-size 2", ""), gpus=8)
    assert dense.strategy.expert_tensor_parallel is None
    assert any("--expert-tensor-parallel-size 2 without --num-experts" in a for a in dense.adjusted)


def test_a_resume_into_other_expert_tensor_parallel_sizes_is_a_change_of_its_own() -> None:
    """Replanning: the experts leaving their own tensor-parallel size is a layout change (Megatron-LM's
    dp_reshardable optimizer state reshards across DP alone); plans that set none compare as before."""
    from parplan.solver.replan import blocked, changes, layout_of, rule_for

    def doc(tp: int, etp: int | None) -> dict[str, object]:
        s = {"kind": "uniform", "tp": tp, "pp": 1, "dp": 4, "cp": 1, "expert_parallel": 4}
        return {"strategy": s | ({"expert_tensor_parallel": etp} if etp is not None else {})}

    moved = changes(layout_of(doc(2, 1)), layout_of(doc(2, None)))
    assert moved is not None and [(c.axis, c.before, c.after) for c in moved] == [("etp", (1,), (2,))]
    rule = rule_for("megatron", reshardable_optimizer=False)
    assert rule is not None and any("etp changes 1 -> 2" in b for b in blocked(rule, layout_of(doc(2, 1)),
                                                                                 layout_of(doc(2, None))))
    plain = changes(layout_of(doc(2, None)), layout_of(doc(4, None)))
    assert plain is not None and [c.axis for c in plain] == ["tp"]


def test_parplan_memory_prices_an_expert_tensor_parallel_size(capsys: pytest.CaptureFixture[str]) -> None:
    """``parplan memory --expert-tensor-parallel 1`` beside ``--tp 2``: the strategy carries it and a
    rank holds the closed form's ``N_exp / ep - N_exp / (ep x tp)`` more expert weight bytes."""
    import json

    from parplan.cli import main
    from parplan.solver.frontends.presets import get_preset

    def run(*extra: str) -> dict[str, Any]:
        assert main(["memory", "--model", "mixtral-8x7b", "--gpus", "8", "--tp", "2", "--pp", "1", "--zero", "1",
                     "--sequence-parallel", "--expert-parallel", "4", "--seq-len", "1024", "--json", *extra]) == 0
        doc: dict[str, Any] = json.loads(capsys.readouterr().out)
        return doc

    cfg = get_preset("mixtral-8x7b")
    n_exp = cfg.layers * cfg.num_experts * 3 * cfg.hidden * cfg.ffn
    split, base = run("--expert-tensor-parallel", "1"), run()
    assert split["strategy"]["expert_tensor_parallel"] == 1 and "etp1" in split["strategy"]["summary"]
    assert "expert_tensor_parallel" not in base["strategy"]
    more = (split["memory"]["stages"][0]["breakdown"]["parameters"]
            - base["memory"]["stages"][0]["breakdown"]["parameters"])
    assert more == pytest.approx(2 * (n_exp / 4 - n_exp / 8), rel=1e-12)


def test_the_cpu_agent_refuses_a_plan_with_an_expert_tensor_parallel_size() -> None:
    """The agent's runner keeps the experts on TP: it refuses such a plan rather than run another one."""
    from parplan.agent.plans import strategy_of_plan

    doc = {"strategy": {"tp": 2, "pp": 1, "dp": 2, "sequence_parallel": True, "expert_tensor_parallel": 1}}
    with pytest.raises(StrategyError, match="expert_tensor_parallel 1"):
        strategy_of_plan(doc)

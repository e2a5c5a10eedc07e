"""Traced Hugging Face models run with per-operator strategies on two gloo processes.

Oracles: the same graph in one process (loss and every gradient, ``rtol=1e-4, atol=1e-6``, as
for the builder's models) and the ILP cost model's per-device memory of the same strategies
(each rank's measured peak within 5%; parameters and gradients exact). Routing is checked against
a loop over tokens written from the definition.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from parplan.agent import moe_exec
from parplan.solver.ilp.strategies import Mesh

MESH = Mesh((("m0", 2),))


def _routing_by_definition(probs: torch.Tensor, top_k: int, capacity: int) -> dict[tuple[int, int], int]:
    """(expert, slot) -> token: tokens in order, each to its top-k experts while they have room."""
    filled: dict[int, int] = {}
    out = {}
    for t in range(probs.shape[0]):
        for e in torch.topk(probs[t], top_k).indices.tolist():
            slot = filled.get(e, 0)
            if slot < capacity:
                out[(e, slot)] = t
            filled[e] = slot + 1
    return out


def test_one_process_routing_fills_each_expert_in_token_order_and_drops_the_rest() -> None:
    probs = torch.softmax(torch.randn(12, 4, generator=torch.Generator().manual_seed(3)), -1)
    r = moe_exec.route(probs, top_k=2, capacity=5)
    want = _routing_by_definition(probs, 2, 5)
    got = {(int(s) // 5, int(s) % 5): int(t) for s, t in zip(r.recv_slots, r.send_tokens, strict=True)}
    assert got == want
    assert len(want) < 12 * 2  # some expert overflowed: the drop is exercised
    x = torch.randn(12, 3)
    slots = moe_exec.dispatch(x, r, None)
    for (e, c), t in want.items():
        assert torch.equal(slots[e, c], x[t])
    y = moe_exec.combine(slots, probs, r, None, 12)
    expected = torch.zeros(12, 3)
    for (e, _), t in want.items():
        expected[t] += probs[t, e] * x[t]
    assert torch.allclose(y, expected)


def _check(result: dict, bound: float = 0.05) -> None:
    assert result["correct"] is True, [r["check"] for r in result["ranks"]]
    assert [r["rank"] for r in result["ranks"]] == [0, 1]
    for r in result["ranks"]:
        meas, pred = r["measured"]["breakdown"], r["predicted"]["breakdown"]
        assert meas["parameters"] == pred["parameters"]
        assert meas["gradients"] == pred["gradients"]
        assert abs(r["relative_error"]) <= bound, (r["measured"], r["predicted"])


@pytest.mark.slow
def test_a_traced_qwen2_runs_with_tensor_parallelism_two_as_predicted() -> None:
    from parplan.agent.traced_validate import QWEN2_TINY, run_traced, tensor_parallel_strategies, traced_graph

    graph = traced_graph(QWEN2_TINY, "qwen2-tiny", batch=2, seq_len=32)
    strategies = tensor_parallel_strategies(graph, MESH)
    assert strategies["model.layers.0.self_attn.q_proj.linear.mm"]["assignment"] == ["kv_heads"]
    assert strategies["model.layers.0.mlp.down_proj.linear_6"]["assignment"] == ["ffn"]
    assert strategies["lm_head.linear_14"]["assignment"] == ["vocab"]
    result = run_traced(graph, strategies, (2,), "qwen2-tiny tp2", "tp2")
    _check(result)
    assert "cross_entropy_loss.tokens" in result["notes"][0]  # the loss runs (and is priced) gathered
    total = 4 * graph.meta["parameter_count"]  # fp32
    assert result["ranks"][0]["measured"]["breakdown"]["parameters"] < 0.6 * total  # really split


@pytest.mark.slow
def test_a_traced_qwen2_moe_runs_with_expert_parallelism_two_as_predicted() -> None:
    from parplan.agent.traced_validate import (
        QWEN2_MOE_TINY,
        expert_parallel_strategies,
        run_traced,
        traced_graph,
    )

    graph = traced_graph(QWEN2_MOE_TINY, "qwen2-moe-tiny", batch=2, seq_len=32)
    strategies = expert_parallel_strategies(graph, MESH)
    dispatch = next(n for n in graph.nodes if n.kind.value == "dispatch")
    assert strategies[dispatch.id]["assignment"] == ["expert"]
    assert strategies["model.layers.0.mlp.gate.linear_7"]["assignment"] == ["batch"]
    result = run_traced(graph, strategies, (2,), "qwen2-moe-tiny ep2", "ep2 dp2")
    _check(result)
    experts = sum(n.numel for n in graph.nodes if n.is_parameter and ".experts." in n.id)
    dense = graph.meta["parameter_count"] - experts
    assert result["ranks"][0]["measured"]["breakdown"]["parameters"] == 4 * (dense + experts // 2)
    assert math.isclose(result["ranks"][0]["check"]["loss"], result["ranks"][1]["check"]["loss"])


@pytest.mark.slow
def test_parplan_validate_runs_the_ilp_plan_of_a_traced_graph_file(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """``parplan validate --plan PLAN --graph GRAPH``: the ILP's own plan for the traced graph (at
    another batch than the file's: the graph is resized to the plan's micro-step)."""
    from parplan.agent.traced_validate import QWEN2_TINY, traced_graph, traced_ilp_plan
    from parplan.cli import main
    from parplan.solver.frontends.resize import resize_graph
    from parplan.solver.wire import graph_to_json

    graph = traced_graph(QWEN2_TINY, "qwen2-tiny", batch=2, seq_len=32)
    plan = traced_ilp_plan(resize_graph(graph, {"batch": 4}), (2,))
    assert plan["strategy"]["kind"] == "intra-operator" and plan["strategy"]["micro_step_batch"] == 4
    (tmp_path / "graph.json").write_text(graph_to_json(graph))
    (tmp_path / "plan.json").write_text(json.dumps(plan, default=str))
    code = main(["validate", "--plan", str(tmp_path / "plan.json"), "--graph", str(tmp_path / "graph.json"),
                 "--device", "cpu", "--json"])
    out = capsys.readouterr()
    result = json.loads(out.out)
    assert code == 0 and result["correct"] is True
    _check(result)
    # operators whose ZeRO-1/2 the interpreter cannot run are named, and the user is told
    sharded = {op for unit in plan["strategy"]["units"] for op, st in unit["ops"].items()
               if st.get("zero") in (1, 2)}
    assert sharded <= set(result["ran_as_zero0"]) and bool(result["ran_as_zero0"]) == bool(sharded)
    assert ("ZeRO-1/2" in out.err) == bool(sharded)

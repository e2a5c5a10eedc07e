"""ILP plans (one strategy per operator) executed with DTensor placements and redistributions.

The oracle for correctness is the same graph run in one process (loss and every gradient,
``torch.allclose(rtol=1e-4, atol=1e-6)``); for memory it is the plan's own prediction, compared
with what MemTracker measured on every rank.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from parplan.agent.ilp_exec import strategies_from_plan
from parplan.agent.ilp_validate import ilp_plan, run_and_compare_plan
from parplan.agent.local_ops import as_matmul
from parplan.agent.matrix import GPT_TINY, LLAMA_TINY
from parplan.agent.plan_interpreter import placements
from parplan.solver.cost.layout import TensorLayout
from parplan.solver.frontends.builder import build_graph
from parplan.solver.ilp.strategies import Mesh
from parplan.solver.ir import make_node

MIB = 2**20


def test_layouts_become_placements_per_mesh_axis() -> None:
    from torch.distributed.tensor import Partial, Replicate, Shard

    mesh = Mesh((("m0", 2), ("m1", 2), ("m2", 2)))
    node = make_node("x", "input", (), {"batch": 8, "seq": 4, "hidden": 8})
    lay = TensorLayout.of({"hidden": ["m0", "m2"]}, partial=["m1"])
    assert placements(lay, node, mesh) == [Shard(2), Partial(), Shard(2)]
    assert placements(TensorLayout(), node, mesh) == [Replicate(), Replicate(), Replicate()]


@pytest.mark.parametrize(("adims", "bdims", "rdims"), [
    (["b", "s", "h"], ["h", "n", "d"], ["b", "s", "n", "d"]),     # Q/K/V projection
    (["b", "s", "n", "d"], ["n", "d", "h"], ["b", "s", "h"]),     # output projection
    (["b", "s", "h"], ["v", "h"], ["b", "s", "v"]),               # tied LM head (transposed weight)
])
def test_linear_einsums_run_as_one_matmul_and_equal_einsum(adims: list[str], bdims: list[str],
                                                           rdims: list[str]) -> None:
    size = dict(zip("bshndv", (2, 3, 8, 2, 4, 5), strict=True))
    a = torch.randn(*[size[d] for d in adims])
    b = torch.randn(*[size[d] for d in bdims])
    got = as_matmul(a, b, adims, bdims, rdims)
    assert got is not None
    want = torch.einsum(f"{''.join(adims)},{''.join(bdims)}->{''.join(rdims)}", a, b)
    assert torch.allclose(got, want, atol=1e-5)


def test_every_operator_of_every_layer_gets_its_representative_strategy() -> None:
    plan = ilp_plan(GPT_TINY, (2, 2), batch=4, seq_len=128)
    graph = build_graph(GPT_TINY, batch=4, seq_len=128)
    strategies = strategies_from_plan(plan, graph)
    ops = [n.id for n in graph.nodes if not n.is_leaf]
    assert set(strategies) == set(ops)
    for i, j in itertools.combinations(range(GPT_TINY.layers), 2):
        assert strategies[f"layers.{i}.mlp.fc1.mm"] == strategies[f"layers.{j}.mlp.fc1.mm"]


#: mesh, objective -> bound on |relative error| of the peak (measured at 3319a01: +0.5% and +2.3%, see
#: docs/notes/ilp-plans-dtensor.md). The 2x2 plan's peak varies from run to run:
#: in 1 of 5 runs one rank held one more collective buffer (+1.1 MiB, +5.8%), as asynchronous
#: collectives finish at different moments; its bound covers that spread.
PEAK_BOUNDS = {((4,), "max-throughput"): 0.05, ((2, 2), "min-memory"): 0.08}


@pytest.mark.slow
@pytest.mark.parametrize(("mesh", "objective"), list(PEAK_BOUNDS))
def test_ilp_plan_runs_correctly_and_its_model_states_are_exact(mesh: tuple[int, ...], objective: str) -> None:
    plan = ilp_plan(GPT_TINY, mesh, batch=4, seq_len=128, objective=objective)
    result = run_and_compare_plan(GPT_TINY, plan, 4, 128)
    assert result["correct"] is True
    assert len(result["ranks"]) == 4
    for r in result["ranks"]:
        meas, pred = r["measured"]["breakdown"], r["predicted"]["breakdown"]
        assert meas["parameters"] == pred["parameters"]
        assert meas["gradients"] == pred["gradients"]
        assert 0 <= meas["optimizer_states"] - pred["optimizer_states"] <= 4 * 200  # Adam's step counters
        assert meas["activations"] > 0
    assert abs(result["most_loaded"]["relative_error"]) <= PEAK_BOUNDS[(mesh, objective)]


@pytest.mark.slow
def test_a_planned_ilp_validation_is_measured_as_the_agent_posts_it() -> None:
    """A plan from the ILP search (bf16, as users ask for it) is run in fp32 and compared with the
    cost model's fp32 pricing of the same per-operator strategies."""
    from parplan.agent.ilp_validate import measurement_for_validation
    from parplan.solver.evaluate import GraphProvider
    from parplan.solver.planner import _ilp
    from parplan.solver.request import parse_plan_request

    hf = {"model_type": "gpt2", "n_layer": 2, "n_embd": 128, "n_head": 4, "vocab_size": 512, "n_positions": 64}
    request = {"model": {"hf_config": hf}, "cluster": {"gpus": 2, "gpu": "A100-80GB"},
               "training": {"global_batch": 4, "seq_len": 64}, "search": "ilp", "mesh": [2]}
    req = parse_plan_request(request)
    plan = _ilp(req, GraphProvider(req.model, req.seq_len), lambda stage, fraction: None, None).to_document()
    assert plan["strategy"]["kind"] == "intra-operator"
    m = measurement_for_validation({"id": "v1", "plan": plan, "request": request}, "cpu", 8, "cpu:test")
    assert m["correct"] is True
    assert [r["rank"] for r in m["ranks"]] == [0, 1]
    for r in m["ranks"]:
        assert r["measured"]["breakdown"]["parameters"] == r["predicted"]["breakdown"]["parameters"]
        assert r["relative_error"]["gradients"] == 0.0
    assert m["max_relative_error"] <= 0.05


@pytest.mark.slow
def test_a_llama_ilp_plan_runs_correctly() -> None:
    """RMSNorm, SwiGLU (SiLU and a product) and grouped-query attention under a 2x2 plan."""
    plan = ilp_plan(LLAMA_TINY, (2, 2), batch=4, seq_len=128, objective="max-throughput")
    result = run_and_compare_plan(LLAMA_TINY, plan, 4, 128)
    assert result["correct"] is True
    for r in result["ranks"]:
        assert r["measured"]["breakdown"]["parameters"] == r["predicted"]["breakdown"]["parameters"]
        assert r["measured"]["breakdown"]["gradients"] == r["predicted"]["breakdown"]["gradients"]


@pytest.mark.slow
def test_a_llama_min_memory_plan_counts_its_relayout_buffers() -> None:
    """llama-tiny's 2x2 min-memory plan. At dcd0808 the ILP chose one that converts the LM head's
    partial, vocabulary-split logits to whole ones for the loss (an all-reduce's buffer, an
    all-gather's and DTensor's concatenation of it: 5 MiB its forward moments did not count), which
    measured 7.5-9.2% above its prediction (docs/notes/ilp-plans-dtensor.md)."""
    plan = ilp_plan(LLAMA_TINY, (2, 2), batch=4, seq_len=128, objective="min-memory")
    result = run_and_compare_plan(LLAMA_TINY, plan, 4, 128)
    assert result["correct"] is True
    assert abs(result["most_loaded"]["relative_error"]) <= 0.05

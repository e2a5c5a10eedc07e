"""Per-operator selective checkpointing (``Recompute.OP``, torchtitan's ``selective_ac_option = "op"``)
against a closed form read off torchtitan's policy, not off parplan's rules.

``torchtitan/distributed/activation_checkpoint.py`` ``_apply_op_sac`` wraps each transformer block in
``create_selective_checkpoint_contexts`` with a policy that MUST_SAVEs the outputs of the ops of its save
list (``aten.mm``, the SDPA kernels, ...) except every second ``aten.mm``, the count restarting with each
block. torchtitan's Llama block (``models/llama3/model.py``) runs, in order: ``attention_norm``,
``wq`` (mm 1, saved), ``wk`` (mm 2, recomputed), ``wv`` (mm 3, saved), rotary embedding, ``repeat_kv``,
SDPA (saved: its output and, flash/efficient kernels, its fp32 log-sum-exp per query row and head),
``wo`` (mm 4, recomputed), the residual add, ``ffn_norm``, ``w1`` (mm 5, saved), ``w3`` (mm 6,
recomputed), SiLU, the product, ``w2`` (mm 7, saved), the residual add. The checkpoint keeps the
block's input besides. Per token of one block, without tensor parallelism, in 16-bit activations:

    2 bytes x (h [input] + h [wq] + kv_heads*head_dim [wv] + h [attention] + ffn [w1] + h [w2])
    + 4 bytes x heads [log-sum-exp]
"""

from __future__ import annotations

import pytest

from parplan.solver.calibration import DEFAULT_CALIBRATION
from parplan.solver.cluster import GPU_PRESETS
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.precision import get_precision
from parplan.solver.cost.runtime import Runtime
from parplan.solver.cost.unit_strategy import UnitStrategy
from parplan.solver.cost.units import GraphCosts, TimeEnv
from parplan.solver.errors import StrategyError
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.strategy import ParallelConfig

H, HEADS, KV, FFN, SEQ, BATCH = 256, 8, 2, 704, 128, 2
CFG = TransformerConfig("llama", "llama-sac-test", 3, H, HEADS, FFN, 512, SEQ, kv_heads=KV)
BLOCK = "layers.1"  # its input is the block before's output, saved by it alone


@pytest.fixture(scope="module")
def costs() -> GraphCosts:
    return GraphCosts(build_graph(CFG, batch=BATCH))


def _unit(gc: GraphCosts, recompute: Recompute, runtime: Runtime = Runtime.TORCHTITAN, env: bool = False):  # type: ignore[no-untyped-def]
    prec = get_precision("bf16")
    time_env = TimeEnv(GPU_PRESETS["H100-80GB"], DEFAULT_CALIBRATION, prec, None) if env else None
    return gc.unit_cost(BLOCK, UnitStrategy(recompute=recompute, runtime=runtime), prec, time_env)


def test_op_saved_activations_match_torchtitans_policy(costs: GraphCosts) -> None:
    head_dim = H // HEADS
    per_token = 2 * (H + H + KV * head_dim + H + FFN + H) + 4 * HEADS
    assert _unit(costs, Recompute.OP).act_bytes == pytest.approx(BATCH * SEQ * per_token)
    # on CPU kernels SDPA runs _scaled_dot_product_flash_attention_for_cpu, outside the save list
    cpu = 2 * (H + H + KV * head_dim + FFN + H)
    assert _unit(costs, Recompute.OP, Runtime.TORCHTITAN_CPU).act_bytes == pytest.approx(BATCH * SEQ * cpu)


@pytest.mark.parametrize("sp", [False, True])
def test_op_under_tensor_parallelism_keeps_the_partial_sums_and_the_reduce_scatters(costs: GraphCosts,
                                                                                     sp: bool) -> None:
    # torchtitan's TP plan (models/llama3/infra/parallelize.py): wq/wk/wv and w1/w3 column-parallel (outputs
    # split over heads / ffn), wo and w2 row-parallel: their mm outputs are whole partial sums, reduced by an
    # all-reduce (not on the save list, recomputed) or, with sequence parallelism, a reduce-scatter (saved:
    # h/t a token, after wo and after w2). The block input is split over the sequence with SP.
    t, head_dim = 2, H // HEADS
    rs = H / t if sp else 0.0
    per_token = 2 * ((H / t if sp else H) + H / t + KV * head_dim / t + H / t + FFN / t + H + 2 * rs) + 4 * HEADS / t
    s = UnitStrategy(tp=t, sp=sp, recompute=Recompute.OP, runtime=Runtime.TORCHTITAN)
    assert costs.unit_cost(BLOCK, s, get_precision("bf16")).act_bytes == pytest.approx(BATCH * SEQ * per_token)


def test_op_rebuilds_the_block_in_backward_like_full(costs: GraphCosts) -> None:
    op, full, none = (_unit(costs, r) for r in (Recompute.OP, Recompute.FULL, Recompute.NONE))
    assert full.act_bytes < op.act_bytes < none.act_bytes
    assert op.recompute_peak_bytes == pytest.approx(full.recompute_peak_bytes) == pytest.approx(none.act_bytes)


def test_op_recomputes_the_unsaved_operators_only(costs: GraphCosts) -> None:
    op, full, none = (_unit(costs, r, env=True) for r in (Recompute.OP, Recompute.FULL, Recompute.NONE))
    assert none.recompute_seconds == 0.0 < op.recompute_seconds < full.recompute_seconds
    prec = get_precision("bf16")
    env = TimeEnv(GPU_PRESETS["H100-80GB"], DEFAULT_CALIBRATION, prec, None)
    saved = {"attn.q", "attn.v", "attn.core", "mlp.gate", "mlp.down"}
    replayed = sum(o.forward for o in costs.operator_seconds(BLOCK, UnitStrategy(runtime=Runtime.TORCHTITAN), env)
                   if o.node.id.removeprefix(f"{BLOCK}.") in saved)
    assert full.recompute_seconds - op.recompute_seconds == pytest.approx(replayed)


@pytest.mark.parametrize("runtime", [Runtime.MEGATRON, Runtime.DEEPSPEED, Runtime.NANOTRON])
def test_op_is_refused_outside_pytorch_native_runtimes(runtime: Runtime) -> None:
    with pytest.raises(StrategyError, match="per-operator"):
        ParallelConfig(dp=2, recompute=Recompute.OP, runtime=runtime)


@pytest.mark.parametrize("target", ["megatron", "deepspeed", "nanotron", "galvatron"])
def test_op_plans_are_not_exported_to_trainers_without_it(target: str) -> None:
    import dataclasses

    from parplan.exports import NotExpressibleError, export_plan
    from parplan.solver.frontends.presets import get_preset

    arch = dataclasses.asdict(get_preset("llama-2-7b"))
    s = {"kind": "uniform", "tp": 1, "pp": 1, "dp": 8, "zero": 1, "sequence_parallel": False, "recompute": "op",
         "micro_batch": 1, "num_microbatches": 1, "global_batch": 8, "schedule": "1f1b", "virtual_stages": 1,
         "precision": "bf16", "expert_parallel": 1, "summary": "test"}
    doc = {"model": {"name": "llama-2-7b", "seq_len": arch["seq_len"], "architecture": arch},
           "cluster": {"gpus": 8, "gpus_per_node": 8}, "strategy": s}
    with pytest.raises(NotExpressibleError, match="op"):
        export_plan(doc, target)


def test_the_ilp_takes_op_between_the_lighter_and_full_and_the_evaluator_agrees() -> None:
    """Under a budget the lighter recomputation misses, the ILP (torch runtime) answers with per-operator
    recomputation; its certificate reprices the answer with the whole-plan evaluator's walk."""
    import math

    from parplan.solver.cluster import GIB, make_cluster
    from parplan.solver.frontends.presets import get_preset
    from parplan.solver.ilp.search import search

    cfg = get_preset("llama-2-7b").with_(layers=3, hidden=256, heads=8, kv_heads=None, head_dim=None, ffn=1024,
                                         vocab=1024, seq_len=512)
    mesh = (2, 2)
    cluster = make_cluster(math.prod(mesh), 8, "A100-80GB")
    doc = search(lambda b: build_graph(cfg, batch=b), cluster, global_batch=8, micro_batch=None,
                 objective="max-throughput", budget_bytes=0.1 * GIB, max_slowdown=0.1, alpha_gib_per_s=None,
                 calibration=DEFAULT_CALIBRATION, timeout_seconds=120, fixed_mesh=mesh,
                 runtime=Runtime.TORCH).to_document()
    assert doc["strategy"]["recompute"] == "op"
    assert doc["solver"]["certificate"]["matches"] is True
    assert doc["memory"]["peak_bytes"] == pytest.approx(doc["solver"]["ilp_memory_bytes"], rel=1e-9, abs=1)
    assert doc["memory"]["peak_bytes"] <= 0.1 * GIB


def test_the_searches_offer_op_between_the_lighter_and_full_where_the_runtime_runs_it() -> None:
    from parplan.solver.cost.rules import search_recomputes

    assert search_recomputes(Runtime.TORCHTITAN, True) == (Recompute.SELECTIVE, Recompute.OP, Recompute.FULL)
    assert search_recomputes(Runtime.TORCH, True)[1] is Recompute.OP
    assert search_recomputes(Runtime.MEGATRON, True) == (Recompute.NONE, Recompute.FULL)
    assert Recompute.OP not in search_recomputes(Runtime.DEEPSPEED, True) + search_recomputes(Runtime.NANOTRON, True)

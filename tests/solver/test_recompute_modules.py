"""Megatron-LM's ``--recompute-modules``: the activations each module set keeps, against closed forms
read off Megatron-LM's code (``transformer_layer.py``, ``moe/moe_layer.py``, ``moe/experts.py``,
Transformer Engine's layer spec in ``gpt_layer_specs.py``), not off parplan's rules.

Dense GPT (flash attention, the attention core checkpointed), per layer, in units of ``sbh`` bytes
(Korthikanti et al. 2022, Sec. 4, with the scores gone): without sequence parallelism 10 replicated
(two norm inputs 2+2, the QKV input 2, the fc1 input 2, two dropout masks 1+1) and 24/t split over
TP (Q, K, V 6, the output projection's input 2, GELU's input 8, fc2's input 8); with it all 34/t.
``mlp`` checkpoints the MLP with its fused pre-MLP norm (``TELayerNormColumnParallelLinear``): it keeps
the norm's input (the residual stream, kept by the norm anyway) and drops the norm's output (2), GELU's
input (8/t) and fc2's input (8/t). ``layernorm`` changes nothing here: Transformer Engine fuses both
norms into the following linear (``IdentityOp``, skipped by ``TransformerLayer``).

Mixture of experts (``E`` experts, top ``k``, capacity ``C = ceil(sbk/E)``, expert width ``f``, one
shared expert of width ``f``, fused SwiGLU), what each module drops per layer:
``moe_act``: fc2's input ``E C f`` (split over expert TP); ``layernorm``: the pre-MLP norm's output
``sbh`` (read by the router and the shared expert; split by SP); ``shared_experts``: its gate, up and
product ``3 sb f`` (split over TP); ``moe``: everything of the layer but its input: the gates ``sbE``,
the dispatched tokens ``E C h``, the experts' gate, up and product ``3 E C f``, their output
``E C h`` and the shared expert's ``3 sb f``. All at 2 bytes.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from parplan.solver.calibration import DEFAULT_CALIBRATION
from parplan.solver.cluster import GPU_PRESETS
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.plan_memory import plan_memory
from parplan.solver.cost.precision import get_precision
from parplan.solver.cost.runtime import Runtime
from parplan.solver.cost.unit_strategy import UnitStrategy
from parplan.solver.cost.units import GraphCosts, TimeEnv
from parplan.solver.errors import StrategyError
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.strategy import ParallelConfig

S, B, A, H = 256, 2, 16, 512
GPT = TransformerConfig("gpt", "gpt-test", 2, H, A, 4 * H, 512, S)
E, K, F = 8, 2, 256
MOE = TransformerConfig(family="mixtral", name="moe-test", layers=2, hidden=H, heads=A, kv_heads=4, ffn=F,
                        vocab=512, seq_len=S, num_experts=E, top_k=K, tied_embeddings=False, shared_experts=1)


def _per_layer(cfg: TransformerConfig, par: ParallelConfig) -> float:
    """Activation bytes of one transformer layer: the difference between L+1 and L layers."""
    small = plan_memory(build_graph(cfg, batch=B), par).stages[0].activation_bytes_per_microbatch
    large = plan_memory(build_graph(cfg.with_(layers=cfg.layers + 1), batch=B), par)
    return large.stages[0].activation_bytes_per_microbatch - small


@pytest.mark.parametrize(("t", "sp"), [(1, False), (4, False), (4, True)])
@pytest.mark.parametrize("recompute", ["selective", "selective:core_attn+layernorm", "selective:core_attn+mlp",
                                       "selective:core_attn+layernorm+mlp"])
def test_dense_gpt_layer_keeps_the_closed_form(t: int, sp: bool, recompute: str) -> None:
    rc = Recompute(recompute)
    replicated, split = (0.0, 34.0) if sp else (10.0, 24.0)
    if "mlp" in rc.modules:
        replicated, split = (replicated - 2, split - 16) if not sp else (0.0, split - 18)
    expected = S * B * H * (replicated + split / t)
    par = ParallelConfig(tp=t, sequence_parallel=sp, recompute=rc, flash_attention=True)
    assert _per_layer(GPT, par) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("t", "sp"), [(1, False), (2, True)])
@pytest.mark.parametrize("modules", [("moe_act",), ("layernorm",), ("shared_experts",), ("moe",),
                                     ("layernorm", "moe"), ("moe_act", "layernorm", "shared_experts"), ("mlp",)])
def test_moe_layer_drops_what_each_module_checkpoints(t: int, sp: bool, modules: tuple[str, ...]) -> None:
    tokens = S * B
    cap = math.ceil(tokens * K / E)
    drops = {"moe_act": E * cap * F / t, "layernorm": tokens * H / (t if sp else 1),
             "shared_experts": 3 * tokens * F / t,
             # the router's scores, the experts' dispatched input, fc1's output and the probability-weighted
             # activation (Megatron-LM's combine keeps no tokens: moe/experts.py weights inside the
             # expert), the shared experts
             "moe": tokens * E / (t if sp else 1) + E * cap * H + 3 * E * cap * F / t + 3 * tokens * F / t,
             "mlp": 0.0}  # a MoE layer's MLP is the moe module's (TransformerLayer skips mlp there)
    covered = {"moe_act", "shared_experts"} if "moe" in modules else set()  # inside the moe checkpoint
    expected = 2 * sum(drops[m] for m in modules if m not in covered)
    base = _per_layer(MOE, ParallelConfig(tp=t, sequence_parallel=sp))
    rc = Recompute.of_modules(["core_attn", *modules])
    assert base - _per_layer(MOE, ParallelConfig(tp=t, sequence_parallel=sp, recompute=rc)) == pytest.approx(
        expected, rel=1e-12)


@pytest.mark.parametrize(("cfg", "recompute", "rerun"), [
    (GPT, "selective:core_attn+mlp", {"ln2", "mlp.fc1.mm", "mlp.fc1", "mlp.act", "mlp.fc2.mm", "mlp.fc2"}),
    (GPT, "selective:core_attn+layernorm", set()),
    (MOE, "selective:core_attn+moe_act", {"moe.experts.act", "moe.experts.mul"}),
    (MOE, "selective:core_attn+layernorm", {"ln2"}),
    (MOE, "selective:core_attn+shared_experts", {f"moe.shared.{x}" for x in ("gate", "up", "act", "mul", "down")}),
])
def test_backward_reruns_the_forward_of_the_checkpointed_modules_only(cfg: TransformerConfig, recompute: str,
                                                                      rerun: set[str]) -> None:
    """Megatron-LM's checkpoints run their module's forward once more in backward (the MLP with its
    fused norm; the experts' SiLU and product; the MoE layer's separate pre-MLP norm): the recomputed
    seconds grow by exactly those operators' forward seconds."""
    gc = GraphCosts(build_graph(cfg, batch=B))
    prec = get_precision("bf16")
    env = TimeEnv(GPU_PRESETS["H100-80GB"], DEFAULT_CALIBRATION, prec, None)
    base, mods = (gc.unit_cost("layers.1", UnitStrategy(recompute=r), prec, env)
                  for r in (Recompute.SELECTIVE, Recompute(recompute)))
    forward = sum(o.forward for o in gc.operator_seconds("layers.1", UnitStrategy(), env)
                  if o.node.id.removeprefix("layers.1.") in rerun)
    assert (forward > 0) == bool(rerun)
    assert mods.recompute_seconds - base.recompute_seconds == pytest.approx(forward, rel=1e-12)


def test_module_sets_spell_one_way_and_keep_the_named_policies() -> None:
    assert Recompute("selective:mlp+core_attn") is Recompute.of_modules(["core_attn", "mlp"])
    assert Recompute("selective:mlp+core_attn").value == "selective:core_attn+mlp"
    assert Recompute.of_modules(["core_attn"]) is Recompute.SELECTIVE
    assert Recompute.of_modules([]) is Recompute.NONE
    assert [r.value for r in Recompute] == ["none", "selective", "full", "op"]
    with pytest.raises(ValueError, match="unknown recompute module"):
        Recompute("selective:core_attn+attn")


@pytest.mark.parametrize(("kwargs", "why"), [
    ({"runtime": "torchtitan"}, "only the megatron runtime"),
    ({"precision": "fp8"}, "Delayed scaling does not support"),
    ({"recompute": Recompute("selective:mla_up_proj")}, "mla_up_proj"),
])
def test_what_megatron_refuses_or_parplan_does_not_price_is_one_line(kwargs: dict[str, Any], why: str) -> None:
    args = {"recompute": Recompute("selective:core_attn+layernorm")} | kwargs
    if "runtime" in args:
        args["runtime"] = Runtime(args["runtime"])
    with pytest.raises(StrategyError, match=why) as info:
        ParallelConfig(tp=2, **args)
    assert "\n" not in str(info.value)
    # FP8 with current scaling runs it (Megatron-LM refuses delayed scaling only)
    if kwargs.get("precision"):
        ParallelConfig(tp=2, precision="fp8-cs", recompute=Recompute("selective:core_attn+layernorm"))


def test_the_megatron_target_searches_module_sets_between_none_and_full() -> None:
    from parplan.solver.cluster import make_cluster
    from parplan.solver.cost.rules import module_recomputes
    from parplan.solver.targets import Target, family

    assert module_recomputes(Runtime.MEGATRON, True, moe=False) == (Recompute("selective:mlp"),)
    assert module_recomputes(Runtime.MEGATRON, True, moe=True) == (Recompute("selective:moe_act"),
                                                                   Recompute("selective:moe_act+layernorm"))
    # an attention core that keeps its scores: core_attn joins each set (selective is the lighter policy)
    assert module_recomputes(Runtime.MEGATRON, False, moe=False) == (Recompute("selective:core_attn+mlp"),)
    assert module_recomputes(Runtime.TORCHTITAN, True, moe=True) == ()
    cluster = make_cluster(8, 8, "H100-80GB")
    dense = {c.recompute for c in family(Target.MEGATRON, cluster, 16, 32)}
    moe = {c.recompute for c in family(Target.MEGATRON, cluster, 16, 32, experts=8)}
    assert dense == {Recompute.NONE, Recompute.FULL, Recompute("selective:mlp")}
    assert moe == {Recompute.NONE, Recompute.FULL, Recompute("selective:moe_act"),
                   Recompute("selective:moe_act+layernorm")}


@pytest.mark.parametrize(("t", "sp"), [(1, False), (4, True)])
def test_backward_rebuilds_what_the_checkpoint_dropped_dense(t: int, sp: bool) -> None:
    """``CheckpointFunction.backward`` runs the MLP's forward again with autograd on: the norm's output
    (2), fc1's output (8/t) and GELU's output (8/t) are alive again while the MLP's backward runs."""
    gc = GraphCosts(build_graph(GPT, batch=B))
    unit = gc.unit_cost("layers.1", UnitStrategy(tp=t, sp=sp, recompute=Recompute("selective:core_attn+mlp")),
                        get_precision("bf16"))
    assert unit.recompute_peak_bytes == pytest.approx(S * B * H * (2 / (t if sp else 1) + 16 / t), rel=1e-12)


@pytest.mark.parametrize(("t", "sp"), [(1, False), (2, True)])
def test_backward_rebuilds_what_the_checkpoint_dropped_moe(t: int, sp: bool) -> None:
    """The pre-MLP norm's output (refilled when the MoE output's gradient arrives) and fc2's input (the
    experts' activation, refilled before fc2's backward), both counted."""
    gc = GraphCosts(build_graph(MOE, batch=B))
    rc = Recompute("selective:core_attn+moe_act+layernorm")
    unit = gc.unit_cost("layers.1", UnitStrategy(tp=t, sp=sp, recompute=rc), get_precision("bf16"))
    cap = math.ceil(S * B * K / E)
    assert unit.recompute_peak_bytes == pytest.approx(2 * (S * B * H / (t if sp else 1) + E * cap * F / t), rel=1e-12)
    plain = gc.unit_cost("layers.1", UnitStrategy(tp=t, sp=sp), get_precision("bf16"))
    assert plain.recompute_peak_bytes == 0.0


@pytest.mark.parametrize("t", [1, 2])
@pytest.mark.parametrize("modules", [("layernorm",), ("mlp",), ("layernorm", "mlp")])
def test_norms_of_their_own_are_checkpointed_apart(t: int, modules: tuple[str, ...]) -> None:
    """The agent's model (runtime torch-cpu) keeps its norms as modules, as Megatron-LM's local spec
    does: ``layernorm`` checkpoints both (``CheckpointWithoutOutput``), dropping their outputs (2 + 2,
    replicated), and ``mlp`` checkpoints the MLP alone, keeping its input, the norm's output: it drops
    GELU's input and fc2's input (16/t), no more."""
    drops = {"layernorm": 4.0, "mlp": 16.0 / t}
    base = _per_layer(GPT, ParallelConfig(tp=t, runtime=Runtime.TORCH_CPU))
    rc = Recompute.of_modules(modules)
    kept = _per_layer(GPT, ParallelConfig(tp=t, runtime=Runtime.TORCH_CPU, recompute=rc))
    assert base - kept == pytest.approx(S * B * H * sum(drops[m] for m in modules), rel=1e-12)


@pytest.mark.parametrize(("runtime", "norm"), [(Runtime.MEGATRON, 1), (Runtime.TORCH_CPU, 0)])
def test_backward_walk_holds_the_rebuilt_mlp_beside_its_gradients(runtime: Runtime, norm: int) -> None:
    """``CheckpointFunction.backward`` (``torch.utils.checkpoint`` in the agent) runs the MLP again when
    its backward starts: while fc2's backward makes its gradients, GELU's rebuilt input and output
    (``s b f`` each) are alive too (the busiest moment of gpt-tiny's measured step under
    ``selective:mlp``), and under Transformer Engine the fused pre-MLP norm's output (``s b h``), so
    the block's transient peak grows by exactly those."""
    gc = GraphCosts(build_graph(GPT, batch=B))
    prec = get_precision("bf16")
    plain, mods = (gc.backward_profile("layers.1", UnitStrategy(recompute=r, runtime=runtime), prec)
                   for r in (Recompute.NONE, Recompute("selective:mlp")))
    assert mods.transient_peak - plain.transient_peak == pytest.approx((2 * 4 * H + norm * H) * S * B * 2, rel=1e-12)

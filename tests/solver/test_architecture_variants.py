"""The architecture variants of DeepSeek-V3, Gemma 3 and gpt-oss: valid graphs, attention priced by
its real shapes (brute-force counts of attended pairs, closed forms), saved buffers unchanged by a
sliding window."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_param_counts import llama_configs, mixtral_configs

from parplan.solver.cost.activations import Recompute, op_saved_items
from parplan.solver.cost.compute import forward_flops
from parplan.solver.errors import ConfigError, GraphValidationError
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.config import TransformerConfig, extra_features
from parplan.solver.frontends.presets import PRESETS, get_preset
from parplan.solver.ir import Graph, OpKind, make_node
from parplan.solver.validate import validate_graph


def _pairs(s: int, window: int) -> int:
    """(query, key) pairs a causal attention of ``s`` tokens computes, brute force: query i sees keys
    i - window + 1 .. i (all keys up to i when ``window`` is 0)."""
    return sum(1 for i in range(s) for j in range(s) if j <= i and (window == 0 or i - j < window))


def _attention(s: int, window: int, *, v_dim: int = 8, qk_dim: int = 8, heads: int = 2) -> Graph:
    qd = {"batch": 1, "seq": s, "heads": heads, "head_dim": qk_dim}
    vd = {"batch": 1, "seq": s, "heads": heads, "v_head_dim": v_dim} if v_dim != qk_dim else qd
    out = {**{k: n for k, n in qd.items() if k != "head_dim"}, ("v_head_dim" if v_dim != qk_dim else "head_dim"): v_dim}
    attrs = {"window": window} if window else {}
    return Graph.of("a", [make_node("q", "input", dims=qd, dtype="bf16"),
                          make_node("k", "input", dims=qd, dtype="bf16"),
                          make_node("v", "input", dims=vd, dtype="bf16"),
                          make_node("o", "attention", ["q", "k", "v"], out, causal=True, **attrs)])


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 40), st.integers(1, 40))
def test_sliding_window_flops_follow_the_attended_pairs(s: int, window: int) -> None:
    """The causal rule prices s²/2 pairs, i.e. every pair below the diagonal and half of the
    diagonal's s; a window prices its own pairs by the same convention."""
    full, windowed = _attention(s, 0), _attention(s, window)
    ratio = forward_flops(windowed.node("o"), windowed) / forward_flops(full.node("o"), full)
    assert ratio == pytest.approx((_pairs(s, window) - s / 2) / (_pairs(s, 0) - s / 2), rel=1e-12)


@given(st.integers(1, 16), st.integers(1, 16), st.integers(1, 8), st.integers(1, 8))
def test_narrow_values_priced_by_their_width(s: int, qk: int, v: int, heads: int) -> None:
    """QKᵀ over the query/key width, PV over the value width: 2·a·s²·(qk + v) / 2 when causal."""
    g = _attention(s, 0, v_dim=v, qk_dim=qk, heads=heads)
    validate_graph(g)
    assert forward_flops(g.node("o"), g) == pytest.approx(heads * s * s * (qk + v))


def test_values_may_differ_from_keys_only_in_their_head_dim() -> None:
    qd = {"batch": 1, "seq": 4, "heads": 2, "head_dim": 8}
    out = {"batch": 1, "seq": 4, "heads": 2, "v_head_dim": 4}
    g = Graph.of("a", [make_node("q", "input", dims=qd, dtype="bf16"), make_node("k", "input", dims=qd, dtype="bf16"),
                       make_node("v", "input", dims={"batch": 1, "seq": 4, "groups": 2, "v_head_dim": 4}, dtype="bf16"),
                       make_node("o", "attention", ["q", "k", "v"], out)])
    with pytest.raises(GraphValidationError, match="by more than their head dim"):
        validate_graph(g)


@pytest.mark.parametrize("flash", [True, False])
def test_window_leaves_saved_buffers_alone(flash: bool) -> None:
    """A window masks scores; it keeps q, k, v, the output (and without flash attention the whole
    score matrix, as eager attention computes it before masking) as full attention does."""
    full, windowed = _attention(16, 0), _attention(16, 4)
    for rec in (Recompute.NONE, Recompute.SELECTIVE):
        def saved(g: Graph, rec: Recompute = rec) -> float:
            return sum(i.total_bytes for i in op_saved_items(g.node("o"), g, 2, flash_attention=flash, recompute=rec))
        assert saved(windowed) == saved(full) > 0


@pytest.mark.parametrize(("name", "windowed", "window"), [("gemma-3-27b", 52, 1024), ("gpt-oss-120b", 18, 128)])
def test_which_layers_slide(name: str, windowed: int, window: int) -> None:
    """Gemma 3: 5 local layers for each global one (layers 5, 11, ... global: 10 of 62); gpt-oss:
    sliding and full attention alternate, the first layer sliding."""
    g = build_graph(get_preset(name))
    cores = [n for n in g.nodes if n.kind is OpKind.ATTENTION]
    sliding = [n.layer for n in cores if n.attrs.get("window")]
    assert len(sliding) == windowed and {n.attrs.get("window") for n in cores} == {window, None}
    first_global = 5 if name == "gemma-3-27b" else 1
    assert "layers.0" in sliding and f"layers.{first_global}" not in sliding


def test_gpt_oss_sinks_are_one_logit_per_head_and_cost_no_flops() -> None:
    cfg = get_preset("gpt-oss-120b").with_(layers=1)
    g, plain = build_graph(cfg, seq_len=256), build_graph(cfg.with_(attention_sinks=False), seq_len=256)
    assert dict(g.node("layers.0.attn.sinks").dims) == {"heads": 64}
    assert forward_flops(g.node("layers.0.attn.core"), g) == forward_flops(plain.node("layers.0.attn.core"), plain)


def test_deepseek_layers_dense_then_experts_with_a_shared_one() -> None:
    g = build_graph(get_preset("deepseek-v3").with_(layers=4))
    assert [f"layers.{i}.mlp.down" in g for i in range(4)] == [True, True, True, False]
    assert "layers.3.moe.shared.down" in g and "layers.3.moe.combine" in g
    assert dict(g.node("layers.0.mlp.down.weight").dims) == {"ffn": 18432, "hidden": 7168}
    core = g.node("layers.3.attn.core")
    assert dict(core.dims) == {"batch": 1, "seq": 4096, "heads": 128, "v_head_dim": 128}
    assert dict(g.node(core.inputs[1]).dims)["head_dim"] == 192  # 128 without position + 64 rotary


@pytest.mark.parametrize("family", ["llama", "mixtral"])
def test_random_variants_build_valid_graphs(family: str) -> None:
    @settings(max_examples=40, deadline=None)
    @given(llama_configs() if family == "llama" else mixtral_configs())
    def check(cfg: TransformerConfig) -> None:
        validate_graph(build_graph(cfg, batch=2, seq_len=8))

    check()


def test_presets_beyond_llama_validate_and_name_their_extra_features() -> None:
    for name in ("deepseek-v3", "gemma-3-27b", "gpt-oss-120b"):
        validate_graph(build_graph(get_preset(name).with_(layers=4)))
    assert extra_features(vars(get_preset("llama-3-8b"))) == []
    assert "multi-head latent attention (DeepSeek)" in extra_features(vars(get_preset("deepseek-v3")))
    assert len(extra_features(vars(get_preset("gemma-3-27b")))) == 3  # sandwich norms, window, GeGLU
    assert not any(extra_features(vars(c)) for n, c in PRESETS.items()
                   if n not in ("deepseek-v3", "gemma-3-27b", "gpt-oss-120b"))


@pytest.mark.parametrize(("changes", "message"), [
    ({"family": "gpt", "sliding_window": 4}, "llama-style models only"),
    ({"family": "llama", "shared_experts": 1}, "mixtures of experts only"),
    ({"family": "llama", "global_every": 2}, "needs a sliding_window"),
    ({"family": "llama", "kv_lora_rank": 4}, "qk_rope_dim > 0"),
    ({"family": "llama", "v_head_dim": 4}, "need kv_lora_rank"),
    ({"family": "llama", "activation": "relu"}, "silu or gelu"),
    ({"family": "mixtral", "num_experts": 2, "dense_layers": 1}, "dense_ffn"),
])
def test_bad_variant_fields_are_refused(changes: dict[str, object], message: str) -> None:
    base: dict[str, object] = {"name": "x", "layers": 2, "hidden": 8, "heads": 2, "ffn": 8, "vocab": 16}
    with pytest.raises(ConfigError, match=message):
        TransformerConfig(**{**base, **changes})  # type: ignore[arg-type]

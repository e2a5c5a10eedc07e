"""Parameter counts of built graphs against independent closed forms and published totals.

The closed forms below are written from the architectures (not from the builder): V vocab,
S max positions (``cfg.seq_len``), h hidden, a heads, g kv heads, d head dim, f ffn, L layers.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.frontends.presets import PRESETS, get_preset


def gpt_params(c: TransformerConfig) -> int:
    V, S, h, a, g, d, f, L = c.vocab, c.seq_len, c.hidden, c.heads, c.n_kv_heads, c.d_head, c.ffn, c.layers
    attn = (h * a * d + a * d) + 2 * (h * g * d + g * d) + (a * d * h + h)
    mlp = (h * f + f) + (f * h + h)
    layer = 2 * h + attn + 2 * h + mlp
    head = 0 if c.tied_embeddings else V * h
    return V * h + S * h + L * layer + 2 * h + head


def llama_attention(c: TransformerConfig) -> int:
    """q, k, v, o (a·d wide), Qwen2's q/k/v biases a·d + 2·g·d, gpt-oss's o bias h and one sink per
    head a, Qwen3's q/k norms 2·d. Multi-head latent attention (DeepSeek): q through a rank-Q
    bottleneck with its norm (h·Q + Q + Q·a·(d + r)), keys and values from a rank-K latent plus one
    r-wide rotary key (h·(K + r) + K + K·a·(d + v)), o from a·v."""
    h, a, g, d = c.hidden, c.heads, c.n_kv_heads, c.d_head
    if c.kv_lora_rank:
        Q, K, r, v = c.q_lora_rank, c.kv_lora_rank, c.qk_rope_dim, c.v_head_dim
        q = h * Q + Q + Q * a * (d + r) if Q else h * a * (d + r)
        return q + h * (K + r) + K + K * a * (d + v) + a * v * h
    proj = h * a * d + 2 * h * g * d + a * d * h
    biases = (a * d + 2 * g * d if c.qkv_bias or c.attention_bias else 0) + (h if c.attention_bias else 0)
    return proj + biases + (2 * d if c.qk_norm else 0) + (a if c.attention_sinks else 0)


def llama_mlp(c: TransformerConfig) -> int:
    return 3 * c.hidden * c.ffn


def mixtral_mlp(c: TransformerConfig, experts: int | None = None) -> int:
    """Router (E·h, + E biases), E SwiGLU experts (3·h·f, + 2f + h biases each), shared experts'
    SwiGLU of S·f; ``experts``: count only that many (the ones a token uses)."""
    h, f, E = c.hidden, c.ffn, c.num_experts
    used = E if experts is None else experts
    expert = 3 * h * f + (2 * f + h if c.moe_bias else 0)
    return h * E + (E if c.moe_bias else 0) + used * expert + 3 * h * c.shared_experts * f


def llama_params(c: TransformerConfig, experts: int | None = None) -> int:
    """Embedding, L blocks (2 norms, or 4 with sandwich norms, attention, MLP; DeepSeek's first
    ``dense_layers`` blocks a dense SwiGLU of ``dense_ffn``), final norm, untied head."""
    V, h, L = c.vocab, c.hidden, c.layers
    norms = (4 if c.sandwich_norms else 2) * h
    if c.family == "mixtral":
        mlps = c.dense_layers * 3 * h * c.dense_ffn + (L - c.dense_layers) * mixtral_mlp(c, experts)
    else:
        mlps = L * llama_mlp(c)
    head = 0 if c.tied_embeddings else V * h
    return V * h + L * (norms + llama_attention(c)) + mlps + h + head


def bert_encoder_params(c: TransformerConfig) -> int:
    """BertModel (embeddings, encoder, pooler) without the pre-training heads."""
    V, S, T, h, a, d, f, L = c.vocab, c.seq_len, c.type_vocab, c.hidden, c.heads, c.d_head, c.ffn, c.layers
    embeddings = V * h + S * h + T * h + 2 * h
    attn = 3 * (h * a * d + a * d) + (a * d * h + h)
    layer = attn + 2 * h + (h * f + f) + (f * h + h) + 2 * h
    pooler = h * h + h
    return embeddings + L * layer + pooler


def bert_params(c: TransformerConfig) -> int:
    mlm_head = (c.hidden * c.hidden + c.hidden) + 2 * c.hidden + c.vocab  # decoder weight tied
    return bert_encoder_params(c) + mlm_head


def t5_params(c: TransformerConfig) -> int:
    V, h, a, d, f, B = c.vocab, c.hidden, c.heads, c.d_head, c.ffn, c.relative_buckets
    attn = 4 * h * a * d
    mlp = (3 if c.gated_mlp else 2) * h * f
    encoder = c.layers * (2 * h + attn + mlp) + B * a + h
    decoder = c.decoder_layers * (3 * h + 2 * attn + mlp) + B * a + h
    head = 0 if c.tied_embeddings else V * h
    return V * h + encoder + decoder + head


def vit_params(c: TransformerConfig) -> int:
    h, a, d, f, L, P, K = c.hidden, c.heads, c.d_head, c.ffn, c.layers, c.patch_size, c.num_classes
    n = (c.image_size // P) ** 2
    embed = (c.channels * P * P * h + h) + h + (n + 1) * h
    attn = 4 * (h * a * d) + 3 * a * d + h
    layer = 2 * h + attn + 2 * h + (h * f + f) + (f * h + h)
    head = h * K + K if K > 0 else 0
    return embed + L * layer + 2 * h + head


CLOSED_FORM: dict[str, Callable[[TransformerConfig], int]] = {
    "gpt": gpt_params,
    "llama": llama_params,
    "mixtral": llama_params,
    "bert": bert_params,
    "t5": t5_params,
    "vit": vit_params,
}

# Totals published for the Hugging Face checkpoints (``model.num_parameters()``).
PUBLISHED = {
    "llama-2-7b": 6_738_415_616,
    "llama-2-13b": 13_015_864_320,
    "llama-2-70b": 68_976_648_192,
    "llama-3-8b": 8_030_261_248,
    "llama-3-70b": 70_553_706_496,
    "mixtral-8x7b": 46_702_792_704,
    "t5-11b": 11_307_321_344,  # T5ForConditionalGeneration, lm_head tied to ``shared`` (counted once)
    "llama-3.1-8b": 8_030_261_248,  # Llama 3.1 has Llama 3's shapes and count
    "llama-3.1-70b": 70_553_706_496,
}

# Totals as the model cards round them, billions: (figure, decimals).
PUBLISHED_ROUNDED = {
    "qwen2.5-72b": (72.7, 1),  # Qwen2.5-72B model card: 72.7B parameters
    "qwen3-32b": (32.8, 1),  # Qwen3-32B model card: 32.8B parameters
    "mixtral-8x22b": (141, 0),  # Mistral AI's announcement of Mixtral 8x22B: 141B parameters, 39B active
    "qwen3-235b-a22b": (235, 0),  # Qwen3-235B-A22B model card: 235B in total, 22B activated
    # DeepSeek-V3 technical report (arXiv 2412.19437) and its model card: 671B parameters for the main model.
    # The hub shows 685B: the main model plus the 14B multi-token-prediction module (one more MoE block, a
    # projection and its own copies of the embedding and head), which parplan does not build (an extra
    # training objective, not part of the model that predicts the next token), so 671B is the figure to compare.
    "deepseek-v3": (671, 0),
    # gpt-oss model card (OpenAI, 2025), Table 1: 116.83B parameters in total
    "gpt-oss-120b": (116.83, 2),
}

# Gemma 3 technical report (arXiv 2503.19786), Table 1, Gemma 3 27B in millions: 25,600M non-embedding
# parameters, 1,416M embedding parameters (and a 417M vision encoder, not part of the text model).
GEMMA3_27B_NON_EMBEDDING_M = 25_600
GEMMA3_27B_EMBEDDING_M = 1_416

# Parameters a token uses (the top-k experts of each layer, not all of them), as published: (figure, decimals,
# whether the figure counts the input embedding). Publishers differ: Mistral AI and Qwen count it; OpenAI's
# gpt-oss model card counts the unembedding but not the embedding (a lookup, no arithmetic).
PUBLISHED_ACTIVE_ROUNDED = {
    "mixtral-8x7b": (12.9, 1, True),  # Mistral AI's announcement of Mixtral 8x7B: 12.9B used per token
    "mixtral-8x22b": (39, 0, True),
    "qwen3-235b-a22b": (22, 0, True),
    # gpt-oss model card (OpenAI, 2025), Table 1: 5.13B active parameters per forward pass
    "gpt-oss-120b": (5.13, 2, False),
    # DeepSeek-V3 technical report (arXiv 2412.19437): "37B activated for each token". Without the input
    # embedding the count is 36.63B (rounds to 37); with it 37.55B (rounds to 38): the published figure
    # agrees with gpt-oss's convention (or with truncation); test_deepseek_v3_active_... pins which.
    "deepseek-v3": (37, 0, False),
}


# --- the closed forms themselves (no builder) -----------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_closed_form_matches_published(name: str) -> None:
    cfg = get_preset(name)
    assert CLOSED_FORM[cfg.family](cfg) == PUBLISHED[name]


@pytest.mark.parametrize("name", sorted(PUBLISHED_ROUNDED))
def test_closed_form_matches_published_rounding(name: str) -> None:
    figure, decimals = PUBLISHED_ROUNDED[name]
    cfg = get_preset(name)
    assert round(CLOSED_FORM[cfg.family](cfg) / 1e9, decimals) == figure


@pytest.mark.parametrize("name", sorted(PUBLISHED_ACTIVE_ROUNDED))
def test_active_parameters_match_published_rounding(name: str) -> None:
    """A token goes through ``top_k`` of each layer's experts: the closed form with that many."""
    figure, decimals, with_embedding = PUBLISHED_ACTIVE_ROUNDED[name]
    cfg = get_preset(name)
    active = llama_params(cfg, experts=cfg.top_k) - (0 if with_embedding else cfg.vocab * cfg.hidden)
    assert round(active / 1e9, decimals) == figure


def test_deepseek_v3_active_count_needs_the_embedding_left_out() -> None:
    """With the input embedding DeepSeek-V3's activated count rounds to 38B, not the published 37B."""
    cfg = get_preset("deepseek-v3")
    assert round(llama_params(cfg, experts=cfg.top_k) / 1e9) == 38


def test_gpt_oss_120b_parts_match_the_model_card() -> None:
    """gpt-oss model card, Table 1: MLP 114.71B, attention 0.96B, embedding + unembedding 1.16B."""
    cfg = get_preset("gpt-oss-120b")
    assert round(cfg.layers * mixtral_mlp(cfg) / 1e9, 2) == 114.71
    assert round(cfg.layers * llama_attention(cfg) / 1e9, 2) == 0.96
    assert round(2 * cfg.vocab * cfg.hidden / 1e9, 2) == 1.16


def test_gemma3_27b_matches_the_technical_report() -> None:
    """Non-embedding parameters to the million; the report's embedding figure adds the vision-to-text
    projection (a 1,152 x 5,376 matrix and a 1,152-wide norm of the soft image tokens) to the
    262,208 x 5,376 token table: 1,409.6M + 6.2M."""
    cfg = get_preset("gemma-3-27b")
    embedding = cfg.vocab * cfg.hidden
    assert round((llama_params(cfg) - embedding) / 1e6) == GEMMA3_27B_NON_EMBEDDING_M
    assert round((embedding + 1152 * cfg.hidden + 1152) / 1e6) == GEMMA3_27B_EMBEDDING_M
    assert build_graph(cfg).parameter_count() == llama_params(cfg)


def test_bert_large_matches_published_bert_model() -> None:
    """bert-large-uncased ``BertModel`` (with pooler) has 335,141,888 parameters."""
    assert bert_encoder_params(get_preset("bert-large")) == 335_141_888


def test_gpt_closed_form_matches_megatron_formula() -> None:
    """Megatron-LM's 12·l·h²·(1 + 13/(12h) + (V+s)/(12lh)) omits only the final LayerNorm (2h)."""
    for name, cfg in PRESETS.items():
        if cfg.family != "gpt":
            continue
        L, h = cfg.layers, cfg.hidden
        megatron = 12 * L * h * h + 13 * L * h + (cfg.vocab + cfg.seq_len) * h
        assert gpt_params(cfg) == megatron + 2 * h, name
        size = name.rsplit("-", 1)[1].rstrip("b")  # "1.7" or "175": rounded as the name is
        decimals = len(size.partition(".")[2])
        assert round(gpt_params(cfg) / 1e9, decimals) == float(size), name


def test_vit_huge_is_632m() -> None:
    assert vit_params(get_preset("vit-huge")) == pytest.approx(632e6, rel=1e-3)


# --- builder against the closed forms ------------------------------------------------------------------


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_parameter_count(name: str) -> None:
    cfg = PRESETS[name]
    assert build_graph(cfg).parameter_count() == CLOSED_FORM[cfg.family](cfg)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_matches_published_total(name: str) -> None:
    assert build_graph(get_preset(name)).parameter_count() == PUBLISHED[name]


def test_parameter_count_independent_of_batch_and_seq() -> None:
    cfg = get_preset("gpt-1.7b").with_(layers=2)
    want = gpt_params(cfg)
    assert build_graph(cfg, batch=4, seq_len=128).parameter_count() == want


# --- small random configs -------------------------------------------------------------------------------


@st.composite
def _attention_shape(draw: st.DrawFn, gqa: bool) -> dict[str, object]:
    """heads, kv_heads (dividing heads when ``gqa``), hidden and an optional explicit head_dim."""
    kv = draw(st.integers(1, 3))
    heads = kv * draw(st.integers(1, 3)) if gqa else draw(st.integers(1, 4))
    base = draw(st.integers(1, 6))
    explicit = draw(st.one_of(st.none(), st.integers(1, 8)))
    return {
        "heads": heads,
        "kv_heads": kv if gqa else None,
        "hidden": heads * base,
        "head_dim": explicit,
    }


def _common(draw: st.DrawFn, gqa: bool) -> dict[str, object]:
    return {
        **draw(_attention_shape(gqa)),
        "layers": draw(st.integers(1, 3)),
        "ffn": draw(st.integers(1, 24)),
        "vocab": draw(st.integers(1, 40)),
        "seq_len": draw(st.integers(1, 16)),
    }


@st.composite
def gpt_configs(draw: st.DrawFn) -> TransformerConfig:
    kw = _common(draw, gqa=draw(st.booleans()))
    return TransformerConfig(family="gpt", name="g", tied_embeddings=draw(st.booleans()), **kw)  # type: ignore[arg-type]


def _llama_variants(draw: st.DrawFn, kw: dict[str, object]) -> dict[str, object]:
    """Qwen, Gemma and gpt-oss attention and norm variants, or multi-head latent attention (DeepSeek)."""
    out: dict[str, object] = {
        "qk_norm": draw(st.booleans()), "sandwich_norms": draw(st.booleans()),
        "activation": draw(st.sampled_from(["silu", "gelu"])), "attention_sinks": draw(st.booleans()),
    }
    window = draw(st.integers(0, 4))
    if window:
        out.update(sliding_window=window, global_every=draw(st.integers(0, 3)))
    if draw(st.booleans()):  # MLA: as many key/value heads as heads, no q/k/v biases
        kw["kv_heads"] = None
        out.update(q_lora_rank=draw(st.integers(0, 5)), kv_lora_rank=draw(st.integers(1, 5)),
                   qk_rope_dim=draw(st.integers(1, 4)), v_head_dim=draw(st.integers(1, 4)))
    else:
        out[draw(st.sampled_from(["qkv_bias", "attention_bias"]))] = draw(st.booleans())
    return out


@st.composite
def llama_configs(draw: st.DrawFn) -> TransformerConfig:
    kw = _common(draw, gqa=True)
    kw.update(_llama_variants(draw, kw))
    return TransformerConfig(family="llama", name="l", tied_embeddings=draw(st.booleans()), **kw)  # type: ignore[arg-type]


@st.composite
def mixtral_configs(draw: st.DrawFn) -> TransformerConfig:
    kw = _common(draw, gqa=True)
    kw.update(_llama_variants(draw, kw))
    experts = draw(st.integers(1, 4))
    dense = draw(st.integers(0, int(kw["layers"])))  # type: ignore[call-overload]
    return TransformerConfig(
        family="mixtral",
        name="m",
        num_experts=experts,
        top_k=draw(st.integers(1, experts)),
        tied_embeddings=draw(st.booleans()),
        moe_bias=draw(st.booleans()),
        shared_experts=draw(st.integers(0, 2)),
        dense_layers=dense,
        dense_ffn=draw(st.integers(1, 24)) if dense else 0,
        **kw,  # type: ignore[arg-type]
    )


@st.composite
def bert_configs(draw: st.DrawFn) -> TransformerConfig:
    kw = _common(draw, gqa=False)
    return TransformerConfig(family="bert", name="b", type_vocab=draw(st.integers(1, 3)), **kw)  # type: ignore[arg-type]


@st.composite
def t5_configs(draw: st.DrawFn) -> TransformerConfig:
    kw = _common(draw, gqa=False)
    return TransformerConfig(
        family="t5",
        name="t",
        decoder_layers=draw(st.integers(1, 3)),
        gated_mlp=draw(st.booleans()),
        tied_embeddings=draw(st.booleans()),
        relative_buckets=draw(st.integers(1, 8)),
        **kw,  # type: ignore[arg-type]
    )


@st.composite
def vit_configs(draw: st.DrawFn) -> TransformerConfig:
    kw = _common(draw, gqa=False)
    patch = draw(st.integers(1, 4))
    kw.update(vocab=0, seq_len=1)
    return TransformerConfig(
        family="vit",
        name="v",
        patch_size=patch,
        image_size=patch * draw(st.integers(1, 4)),
        channels=draw(st.integers(1, 3)),
        num_classes=draw(st.integers(0, 5)),
        **kw,  # type: ignore[arg-type]
    )


STRATEGIES: dict[str, st.SearchStrategy[TransformerConfig]] = {
    "gpt": gpt_configs(),
    "llama": llama_configs(),
    "mixtral": mixtral_configs(),
    "bert": bert_configs(),
    "t5": t5_configs(),
    "vit": vit_configs(),
}


@pytest.mark.parametrize("family", sorted(STRATEGIES))
def test_random_small_configs(family: str) -> None:
    @settings(max_examples=30, deadline=None)
    @given(STRATEGIES[family])
    def check(cfg: TransformerConfig) -> None:
        assert cfg.family == family
        assert build_graph(cfg).parameter_count() == CLOSED_FORM[family](cfg), cfg

    check()

"""Named presets: every listed model exists with its published shape; lookup is forgiving."""

from __future__ import annotations

import pytest

from parplan.solver.errors import SolverError, UnknownModelError
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.frontends.presets import PRESETS, get_preset, preset_names

EXPECTED_NAMES = [
    "bert-large",
    "gpt-1.7b",
    "gpt-3.6b",
    "gpt-7.5b",
    "gpt-18.4b",
    "gpt-39.1b",
    "gpt-76.1b",
    "gpt-145.6b",
    "gpt3-175b",
    "llama-2-7b",
    "llama-2-13b",
    "llama-2-70b",
    "llama-3-8b",
    "llama-3-70b",
    "llama-3-405b",
    "llama-3.1-8b",
    "llama-3.1-70b",
    "llama-3.1-405b",
    "qwen2.5-7b",
    "qwen2.5-72b",
    "qwen3-32b",
    "t5-11b",
    "vit-huge",
    "mixtral-8x7b",
    "mixtral-8x22b",
    "qwen3-235b-a22b",
    "deepseek-v3",
    "gemma-3-27b",
    "gpt-oss-120b",
]

# name: (family, layers, hidden, heads, ffn, vocab, seq_len, kv_heads as n_kv_heads)
SHAPES: dict[str, tuple[str, int, int, int, int, int, int, int]] = {
    "bert-large": ("bert", 24, 1024, 16, 4096, 30522, 512, 16),
    "gpt-1.7b": ("gpt", 24, 2304, 24, 4 * 2304, 51200, 2048, 24),
    "gpt-3.6b": ("gpt", 30, 3072, 32, 4 * 3072, 51200, 2048, 32),
    "gpt-7.5b": ("gpt", 36, 4096, 32, 4 * 4096, 51200, 2048, 32),
    "gpt-18.4b": ("gpt", 40, 6144, 48, 4 * 6144, 51200, 2048, 48),
    "gpt-39.1b": ("gpt", 48, 8192, 64, 4 * 8192, 51200, 2048, 64),
    "gpt-76.1b": ("gpt", 60, 10240, 80, 4 * 10240, 51200, 2048, 80),
    "gpt-145.6b": ("gpt", 80, 12288, 96, 4 * 12288, 51200, 2048, 96),
    "gpt3-175b": ("gpt", 96, 12288, 96, 4 * 12288, 51200, 2048, 96),
    "llama-2-7b": ("llama", 32, 4096, 32, 11008, 32000, 4096, 32),
    "llama-2-13b": ("llama", 40, 5120, 40, 13824, 32000, 4096, 40),
    "llama-2-70b": ("llama", 80, 8192, 64, 28672, 32000, 4096, 8),
    "llama-3-8b": ("llama", 32, 4096, 32, 14336, 128256, 8192, 8),
    "llama-3-70b": ("llama", 80, 8192, 64, 28672, 128256, 8192, 8),
    "llama-3-405b": ("llama", 126, 16384, 128, 53248, 128256, 8192, 8),
    "llama-3.1-8b": ("llama", 32, 4096, 32, 14336, 128256, 8192, 8),
    "llama-3.1-70b": ("llama", 80, 8192, 64, 28672, 128256, 8192, 8),
    "llama-3.1-405b": ("llama", 126, 16384, 128, 53248, 128256, 8192, 8),
    "qwen2.5-7b": ("llama", 28, 3584, 28, 18944, 152064, 4096, 4),
    "qwen2.5-72b": ("llama", 80, 8192, 64, 29568, 152064, 4096, 8),
    "qwen3-32b": ("llama", 64, 5120, 64, 25600, 151936, 4096, 8),
    "t5-11b": ("t5", 24, 1024, 128, 65536, 32128, 512, 128),
    "vit-huge": ("vit", 32, 1280, 16, 5120, 0, 257, 16),
    "mixtral-8x7b": ("mixtral", 32, 4096, 32, 14336, 32000, 4096, 8),
    "mixtral-8x22b": ("mixtral", 56, 6144, 48, 16384, 32768, 4096, 8),
    "qwen3-235b-a22b": ("mixtral", 94, 4096, 64, 1536, 151936, 4096, 4),
    "deepseek-v3": ("mixtral", 61, 7168, 128, 2048, 129280, 4096, 128),
    "gemma-3-27b": ("llama", 62, 5376, 32, 21504, 262208, 32768, 16),
    "gpt-oss-120b": ("mixtral", 36, 2880, 64, 2880, 201088, 4096, 8),
}


def test_all_names_exist_in_order() -> None:
    assert preset_names() == EXPECTED_NAMES
    assert set(PRESETS) == set(EXPECTED_NAMES)
    assert all(isinstance(c, TransformerConfig) and c.name == n for n, c in PRESETS.items())


@pytest.mark.parametrize("name", EXPECTED_NAMES)
def test_shape(name: str) -> None:
    c = get_preset(name)
    got = (c.family, c.layers, c.hidden, c.heads, c.ffn, c.vocab, c.seq_len, c.n_kv_heads)
    assert got == SHAPES[name]


def test_family_specific_fields() -> None:
    for name in EXPECTED_NAMES:
        c = get_preset(name)
        assert c.tied_embeddings is (c.family not in ("llama", "mixtral") or name == "gemma-3-27b"), name
    t5 = get_preset("t5-11b")
    assert (t5.decoder_layers, t5.d_head, t5.gated_mlp, t5.relative_buckets) == (24, 128, False, 32)
    vit = get_preset("vit-huge")
    assert (vit.image_size, vit.patch_size, vit.channels, vit.num_classes) == (224, 14, 3, 1000)
    assert vit.tokens_per_sample == 257
    mix = get_preset("mixtral-8x7b")
    assert (mix.num_experts, mix.top_k) == (8, 2)
    assert (get_preset("mixtral-8x22b").num_experts, get_preset("mixtral-8x22b").top_k) == (8, 2)
    qwen_moe = get_preset("qwen3-235b-a22b")
    assert (qwen_moe.num_experts, qwen_moe.top_k, qwen_moe.d_head) == (128, 8, 128)
    assert get_preset("bert-large").type_vocab == 2
    assert get_preset("llama-2-7b").d_head == 128
    for name in EXPECTED_NAMES:
        c = get_preset(name)
        assert (c.qkv_bias, c.qk_norm) == (name.startswith("qwen2"), name.startswith(("qwen3", "gemma-3"))), name
    ds = get_preset("deepseek-v3")  # config.json of deepseek-ai/DeepSeek-V3
    assert (ds.num_experts, ds.top_k, ds.shared_experts, ds.dense_layers, ds.dense_ffn) == (256, 8, 1, 3, 18432)
    assert (ds.q_lora_rank, ds.kv_lora_rank, ds.d_head, ds.qk_rope_dim, ds.v_head_dim) == (1536, 512, 128, 64, 128)
    gemma = get_preset("gemma-3-27b")  # text_config of google/gemma-3-27b-pt
    assert (gemma.d_head, gemma.sliding_window, gemma.global_every, gemma.activation) == (128, 1024, 6, "gelu")
    assert gemma.sandwich_norms
    oss = get_preset("gpt-oss-120b")  # config.json of openai/gpt-oss-120b
    assert (oss.num_experts, oss.top_k, oss.d_head, oss.sliding_window, oss.global_every) == (128, 4, 64, 128, 2)
    assert oss.attention_bias and oss.attention_sinks and oss.moe_bias
    assert get_preset("qwen3-32b").d_head == 128  # 64 heads of 128 over a hidden of 5,120


@pytest.mark.parametrize("spelling", ["LLaMA-2-7B", "llama-2-7b", "  Llama-2-7b ", "LLAMA-2-7B"])
def test_case_insensitive(spelling: str) -> None:
    assert get_preset(spelling) is PRESETS["llama-2-7b"]


def test_unknown_name_suggests_close_matches() -> None:
    with pytest.raises(UnknownModelError) as e:
        get_preset("llama2-7b")
    msg = str(e.value)
    assert "llama2-7b" in msg
    assert "did you mean" in msg
    assert "llama-2-7b" in msg
    assert all(n in msg for n in EXPECTED_NAMES)  # lists every known name
    assert isinstance(e.value, SolverError)


def test_unknown_name_without_close_match() -> None:
    with pytest.raises(UnknownModelError, match="known presets") as e:
        get_preset("zzzzzzzz")
    assert "did you mean" not in str(e.value)


def test_presets_are_read_only() -> None:
    with pytest.raises(TypeError):
        PRESETS["x"] = PRESETS["gpt-1.7b"]  # type: ignore[index]

"""Named model presets: the published shapes of common transformers."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from types import MappingProxyType

from parplan.solver.errors import UnknownModelError
from parplan.solver.frontends.config import TransformerConfig


def _gpt(name: str, layers: int, hidden: int, heads: int) -> TransformerConfig:
    """A GPT-3-style decoder (Megatron sizes): ffn 4h, vocab 51200, seq 2048, tied embeddings."""
    return TransformerConfig(
        family="gpt", name=name, layers=layers, hidden=hidden, heads=heads, ffn=4 * hidden,
        vocab=51200, seq_len=2048, tied_embeddings=True,
    )


def _llama(
    name: str, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int, seq_len: int,
    head_dim: int | None = None, qkv_bias: bool = False, qk_norm: bool = False,
) -> TransformerConfig:
    return TransformerConfig(
        family="llama", name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
        ffn=ffn, vocab=vocab, seq_len=seq_len, tied_embeddings=False, head_dim=head_dim,
        qkv_bias=qkv_bias, qk_norm=qk_norm,
    )


_ALL: tuple[TransformerConfig, ...] = (
    TransformerConfig(
        family="bert", name="bert-large", layers=24, hidden=1024, heads=16, ffn=4096,
        vocab=30522, seq_len=512, type_vocab=2,
    ),
    _gpt("gpt-1.7b", 24, 2304, 24),
    _gpt("gpt-3.6b", 30, 3072, 32),
    _gpt("gpt-7.5b", 36, 4096, 32),
    _gpt("gpt-18.4b", 40, 6144, 48),
    _gpt("gpt-39.1b", 48, 8192, 64),
    _gpt("gpt-76.1b", 60, 10240, 80),
    _gpt("gpt-145.6b", 80, 12288, 96),
    _gpt("gpt3-175b", 96, 12288, 96),
    _llama("llama-2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
    _llama("llama-2-13b", 40, 5120, 40, 40, 13824, 32000, 4096),
    _llama("llama-2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
    _llama("llama-3-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
    _llama("llama-3-70b", 80, 8192, 64, 8, 28672, 128256, 8192),
    _llama("llama-3-405b", 126, 16384, 128, 8, 53248, 128256, 8192),
    # Llama 3.1: the shapes of Llama 3 (its longer context is rope scaling, not parameters)
    _llama("llama-3.1-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
    _llama("llama-3.1-70b", 80, 8192, 64, 8, 28672, 128256, 8192),
    _llama("llama-3.1-405b", 126, 16384, 128, 8, 53248, 128256, 8192),
    # Qwen2.5 (config.json of Qwen/Qwen2.5-7B and -72B): biases on q, k, v; pre-trained at 4,096 tokens
    _llama("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, 4096, qkv_bias=True),
    _llama("qwen2.5-72b", 80, 8192, 64, 8, 29568, 152064, 4096, qkv_bias=True),
    # Qwen3-32B (config.json of Qwen/Qwen3-32B): head dim 128 (64 heads over hidden 5,120), q/k norm
    _llama("qwen3-32b", 64, 5120, 64, 8, 25600, 151936, 4096, head_dim=128, qk_norm=True),
    TransformerConfig(
        family="t5", name="t5-11b", layers=24, decoder_layers=24, hidden=1024, heads=128, head_dim=128,
        ffn=65536, vocab=32128, seq_len=512, tied_embeddings=True, gated_mlp=False, relative_buckets=32,
    ),
    TransformerConfig(
        family="vit", name="vit-huge", layers=32, hidden=1280, heads=16, ffn=5120, vocab=0,
        seq_len=(224 // 14) ** 2 + 1, image_size=224, patch_size=14, channels=3, num_classes=1000,
    ),
    TransformerConfig(
        family="mixtral", name="mixtral-8x7b", layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336,
        vocab=32000, seq_len=4096, num_experts=8, top_k=2, tied_embeddings=False,
    ),
    # Mixtral-8x22B (config.json of mistralai/Mixtral-8x22B-v0.1): 8 experts of 16,384, top 2
    TransformerConfig(
        family="mixtral", name="mixtral-8x22b", layers=56, hidden=6144, heads=48, kv_heads=8, ffn=16384,
        vocab=32768, seq_len=4096, num_experts=8, top_k=2, tied_embeddings=False,
    ),
    # Qwen3-235B-A22B (config.json of Qwen/Qwen3-235B-A22B): every layer a mixture of 128 experts of
    # 1,536 (moe_intermediate_size), top 8, head dim 128, q/k norm, no shared expert
    TransformerConfig(
        family="mixtral", name="qwen3-235b-a22b", layers=94, hidden=4096, heads=64, kv_heads=4, head_dim=128,
        ffn=1536, vocab=151936, seq_len=4096, num_experts=128, top_k=8, tied_embeddings=False, qk_norm=True,
    ),
    # DeepSeek-V3 (config.json of deepseek-ai/DeepSeek-V3; DeepSeek-V3 technical report): multi-head
    # latent attention (q_lora_rank 1536, kv_lora_rank 512, 128 heads of 128 + 64 rotary, values of 128),
    # the first 3 layers dense (intermediate_size 18,432), then 256 routed experts of 2,048 (top 8) and
    # one shared expert; pre-trained at 4,096 tokens. The multi-token-prediction module is not built.
    TransformerConfig(
        family="mixtral", name="deepseek-v3", layers=61, hidden=7168, heads=128, head_dim=128, ffn=2048,
        vocab=129280, seq_len=4096, num_experts=256, top_k=8, tied_embeddings=False, shared_experts=1,
        dense_layers=3, dense_ffn=18432, q_lora_rank=1536, kv_lora_rank=512, qk_rope_dim=64, v_head_dim=128,
    ),
    # Gemma-3-27B's text model (text_config of google/gemma-3-27b-pt; the vision tower is not built):
    # 32 heads of 128 over 16 key/value heads, q/k norms, norms before and after the attention and the
    # MLP, GeGLU, a tied vocabulary of 262,208, a window of 1,024 keys on 5 layers of every 6
    TransformerConfig(
        family="llama", name="gemma-3-27b", layers=62, hidden=5376, heads=32, kv_heads=16, head_dim=128,
        ffn=21504, vocab=262208, seq_len=32768, tied_embeddings=True, qk_norm=True, sandwich_norms=True,
        activation="gelu", sliding_window=1024, global_every=6,
    ),
    # gpt-oss-120b (config.json of openai/gpt-oss-120b; gpt-oss model card): 64 heads of 64 over 8
    # key/value heads with biases and attention sinks, a window of 128 keys on every other layer (the
    # first included), 128 experts of 2,880 with biases (top 4), untied vocabulary of 201,088;
    # initial_context_length 4,096
    TransformerConfig(
        family="mixtral", name="gpt-oss-120b", layers=36, hidden=2880, heads=64, kv_heads=8, head_dim=64,
        ffn=2880, vocab=201088, seq_len=4096, num_experts=128, top_k=4, tied_embeddings=False,
        attention_bias=True, attention_sinks=True, moe_bias=True, sliding_window=128, global_every=2,
    ),
)

#: Every preset by its (lower-case) name.
PRESETS: Mapping[str, TransformerConfig] = MappingProxyType({c.name: c for c in _ALL})


def preset_names() -> list[str]:
    """All preset names, in definition order."""
    return list(PRESETS)


def get_preset(name: str) -> TransformerConfig:
    """The preset called ``name`` (case-insensitive); :class:`UnknownModelError` if there is none."""
    key = name.strip().lower()
    try:
        return PRESETS[key]
    except KeyError:
        pass
    close = difflib.get_close_matches(key, list(PRESETS), n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise UnknownModelError(f"unknown model preset {name!r}; {hint}known presets: {', '.join(PRESETS)}")

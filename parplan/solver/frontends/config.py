"""Architecture description of a transformer, shared by the builder, HF import and presets."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from parplan.solver.errors import ConfigError

Family = Literal["gpt", "llama", "bert", "t5", "vit", "mixtral"]


@dataclass(frozen=True)
class TransformerConfig:
    """A transformer's shape. Sizes in elements; ``seq_len`` is the default training sequence.

    - ``gpt``: learned positions, LayerNorm with bias, GELU MLP, biases, tied embeddings.
    - ``llama``: RoPE (no position parameters), RMSNorm, SwiGLU MLP, grouped-query attention,
      no biases, untied embeddings (unless ``tied_embeddings``).
    - ``bert``: learned positions + token types, post-LN, GELU, pooler and MLM head (tied decoder).
    - ``t5``: encoder-decoder, RMSNorm (no bias), relative position bias per stack, ReLU or gated-GELU
      MLP, no biases, untied LM head unless ``tied_embeddings``; ``layers`` encoder, ``decoder_layers``.
    - ``vit``: patch embedding, class token, learned positions, pre-LN, GELU, classification head.
    - ``mixtral``: llama blocks whose MLP is ``num_experts`` SwiGLU experts with top-k routing.

    Llama-style variants: ``qkv_bias`` (Qwen2: biases on q, k, v), ``qk_norm`` (Qwen3: RMSNorm of
    each head's q and k over the head dim).
    """

    family: Family
    name: str
    layers: int
    hidden: int
    heads: int
    ffn: int
    vocab: int = 0
    seq_len: int = 2048
    kv_heads: int | None = None  # None: equal to heads (multi-head attention)
    head_dim: int | None = None  # None: hidden // heads
    tied_embeddings: bool = True
    decoder_layers: int = 0  # t5 only
    num_experts: int = 0  # mixtral only
    top_k: int = 2  # mixtral only
    capacity_factor: float = 1.0  # mixtral: expert capacity = ceil(tokens * top_k / experts * factor)
    gated_mlp: bool = False  # t5 v1.1 gated-GELU; llama/mixtral always gated (SwiGLU)
    relative_buckets: int = 32  # t5 relative attention buckets
    type_vocab: int = 2  # bert token types
    image_size: int = 224  # vit
    patch_size: int = 14  # vit
    channels: int = 3  # vit
    num_classes: int = 1000  # vit classifier head (0: none)
    qkv_bias: bool = False  # llama/mixtral: biases on the q, k and v projections only (Qwen2)
    qk_norm: bool = False  # llama/mixtral: RMSNorm over each head's q and k before attention (Qwen3)

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "ffn"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{self.name}: {name} must be positive, got {getattr(self, name)}")
        if self.head_dim is None and self.hidden % self.heads:
            raise ConfigError(f"{self.name}: heads ({self.heads}) must divide hidden ({self.hidden})")
        if self.kv_heads is not None and (self.kv_heads <= 0 or self.heads % self.kv_heads):
            raise ConfigError(f"{self.name}: kv_heads ({self.kv_heads}) must divide heads ({self.heads})")
        if self.family != "vit" and self.vocab <= 0:
            raise ConfigError(f"{self.name}: vocab must be positive")
        if self.family == "mixtral" and not (0 < self.top_k <= self.num_experts):
            raise ConfigError(f"{self.name}: need 0 < top_k <= num_experts")
        if self.family == "t5" and self.decoder_layers <= 0:
            raise ConfigError(f"{self.name}: t5 needs decoder_layers > 0")
        if self.family == "vit" and self.image_size % self.patch_size:
            raise ConfigError(f"{self.name}: patch_size must divide image_size")
        if (self.qkv_bias or self.qk_norm) and self.family not in ("llama", "mixtral"):
            raise ConfigError(f"{self.name}: qkv_bias and qk_norm apply to llama-style models only")

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def d_head(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden // self.heads

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def tokens_per_sample(self) -> int:
        """Sequence positions per sample (ViT: patches + class token)."""
        return self.num_patches + 1 if self.family == "vit" else self.seq_len

    @property
    def total_layers(self) -> int:
        return self.layers + self.decoder_layers

    def with_(self, **changes: object) -> TransformerConfig:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)  # type: ignore[arg-type]

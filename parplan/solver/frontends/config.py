"""Architecture description of a transformer, shared by the builder, HF import and presets."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from parplan.solver.errors import ConfigError

Family = Literal["gpt", "llama", "bert", "t5", "vit", "mixtral"]
Activation = Literal["silu", "gelu"]
Norm = Literal["layernorm", "rmsnorm"]
Positions = Literal["learned", "rope", "none"]
#: Megatron-LM's names of each (its ``--normalization`` and ``--position-embedding-type`` choices)
MEGATRON_NORMS: dict[Norm, str] = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}
MEGATRON_POSITIONS: dict[Positions, str] = {"learned": "learned_absolute", "rope": "rope", "none": "none"}
#: the families whose blocks take ``norm``, ``positions`` and ``linear_bias`` (Megatron-LM's GPTModel)
DECODER_FAMILIES = ("gpt", "llama", "mixtral")

#: Architecture fields beyond Llama/Mixtral/Qwen's, with what they describe: what exports and the
#: validation agent must refuse while they do not build them (see :func:`extra_features`).
EXTRA_FEATURES: dict[str, str] = {
    "sandwich_norms": "norms after the attention and the MLP (Gemma)",
    "sliding_window": "sliding-window attention",
    "attention_bias": "biases on the attention projections (gpt-oss)",
    "attention_sinks": "attention sinks (gpt-oss)",
    "moe_bias": "router and expert biases (gpt-oss)",
    "shared_experts": "shared experts (DeepSeek)",
    "dense_layers": "dense first layers of a mixture of experts (DeepSeek)",
    "kv_lora_rank": "multi-head latent attention (DeepSeek)",
}

_LLAMA_ONLY = ("sandwich_norms", "sliding_window", "attention_bias", "attention_sinks",
               "kv_lora_rank")
_MOE_ONLY = ("moe_bias", "shared_experts", "dense_layers")


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
    - ``gpt`` with ``num_experts`` > 0: GPT blocks whose MLP is ``num_experts`` GELU experts (not gated)
      with top-k routing (Megatron-LM's GPT with ``--num-experts`` and without ``--swiglu``).

    Llama-style variants: ``qkv_bias`` (Qwen2: biases on q, k, v), ``qk_norm`` (Qwen3: the model's
    norm, RMSNorm, of each head's q and k over the head dim), and the fields after ``qk_norm`` (Gemma 3, gpt-oss,
    DeepSeek-V3; all off by default). Multi-head latent attention (``kv_lora_rank`` > 0): queries
    through a rank-``q_lora_rank`` bottleneck, keys and values from a rank-``kv_lora_rank`` latent;
    each head's query/key is ``head_dim`` (no position) + ``qk_rope_dim`` (rotary, one key part
    shared by the heads) wide, its value ``v_head_dim`` wide.

    ``gpt``, ``llama`` and ``mixtral`` take Megatron-LM's GPTModel choices (None: the family's own,
    above): ``norm`` (``layernorm``: weight and bias; ``rmsnorm``: weight only; the blocks', the final
    one and, with ``qk_norm``, q's and k's: Megatron-LM's ``--normalization``), ``positions``
    (``learned``: a table of ``seq_len`` rows added to the token embedding; ``rope``: rotary, no
    parameters; ``none``: no position information; ``--position-embedding-type``) and
    ``linear_bias`` (biases on q/k/v, the attention's output and the dense MLP's projections; not
    ``--disable-bias-linear``). ``qkv_bias`` and ``qk_norm`` apply to these three families.
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
    num_experts: int = 0  # mixtral; gpt: > 0 for GELU experts
    top_k: int = 2  # mixtral, a gpt with experts
    capacity_factor: float = 1.0  # mixtral: expert capacity = ceil(tokens * top_k / experts * factor)
    gated_mlp: bool = False  # t5 v1.1 gated-GELU; llama/mixtral always gated (SwiGLU)
    relative_buckets: int = 32  # t5 relative attention buckets
    type_vocab: int = 2  # bert token types
    image_size: int = 224  # vit
    patch_size: int = 14  # vit
    channels: int = 3  # vit
    num_classes: int = 1000  # vit classifier head (0: none)
    qkv_bias: bool = False  # gpt/llama/mixtral: biases on the q, k and v projections (Qwen2)
    qk_norm: bool = False  # gpt/llama/mixtral: the model's norm over each head's q and k before attention (Qwen3)
    activation: Activation = "silu"  # llama/mixtral gated MLP: silu (SwiGLU) or gelu (GeGLU, Gemma)
    sandwich_norms: bool = False  # Gemma 2/3: RMSNorm of the attention's and the MLP's outputs too
    sliding_window: int = 0  # keys a query sees on sliding-window layers (0: every layer attends globally)
    global_every: int = 0  # with sliding_window: layers n-1, 2n-1, ... attend globally (0: none does)
    attention_bias: bool = False  # biases on q, k, v and o (gpt-oss)
    attention_sinks: bool = False  # a learned logit per head in each softmax's denominator (gpt-oss)
    moe_bias: bool = False  # mixtral: biases on the router and on every expert's projections (gpt-oss)
    shared_experts: int = 0  # mixtral: experts every token uses, one SwiGLU MLP of shared_experts * ffn
    dense_layers: int = 0  # mixtral: the first n layers have a dense MLP of dense_ffn (DeepSeek-V3: 3)
    dense_ffn: int = 0
    q_lora_rank: int = 0  # multi-head latent attention (DeepSeek-V2/V3); 0 with kv_lora_rank > 0: plain q
    kv_lora_rank: int = 0  # > 0: multi-head latent attention
    qk_rope_dim: int = 0  # MLA: rotary part of each head's query and key
    v_head_dim: int = 0  # MLA: each head's value width
    #: dropout probability after the embeddings and the attention's and the MLP's outputs, and on the
    #: attention probabilities (None: the family's usual, :attr:`dropout_p`); only whether it is 0
    #: changes what is priced (a dropout keeps its mask, whatever the probability)
    dropout: float | None = None
    norm: Norm | None = None  # gpt/llama/mixtral: None is the family's (gpt: layernorm, else rmsnorm)
    positions: Positions | None = None  # gpt/llama/mixtral: None is the family's (gpt: learned, else rope)
    linear_bias: bool | None = None  # gpt/llama/mixtral: None is the family's (gpt: True, else False)

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
        if self.num_experts and self.family not in ("gpt", "mixtral"):
            raise ConfigError(f"{self.name}: experts are built for gpt and mixtral models only")
        if self.is_moe and not (0 < self.top_k <= self.num_experts):
            raise ConfigError(f"{self.name}: need 0 < top_k <= num_experts")
        if self.family == "t5" and self.decoder_layers <= 0:
            raise ConfigError(f"{self.name}: t5 needs decoder_layers > 0")
        if self.family == "vit" and self.image_size % self.patch_size:
            raise ConfigError(f"{self.name}: patch_size must divide image_size")
        self._check_variants()

    def _check_variants(self) -> None:
        """The Llama-style variants' fields: on the families that have them, with sizes that fit."""
        if self.family not in DECODER_FAMILIES:
            used = [f for f in ("norm", "positions", "linear_bias") if getattr(self, f) is not None]
            used += [f for f in ("qkv_bias", "qk_norm") if getattr(self, f)]
            if used:
                raise ConfigError(f"{self.name}: {', '.join(used)} apply to gpt, llama and mixtral models only")
        if self.norm not in (None, "layernorm", "rmsnorm"):
            raise ConfigError(f"{self.name}: norm must be layernorm or rmsnorm, got {self.norm!r}")
        if self.positions not in (None, "learned", "rope", "none"):
            raise ConfigError(f"{self.name}: positions must be learned, rope or none, got {self.positions!r}")
        if self.family not in ("llama", "mixtral"):
            used = [f for f in _LLAMA_ONLY if getattr(self, f)] + (["activation"] if self.activation != "silu" else [])
            if used:
                raise ConfigError(f"{self.name}: {', '.join(used)} apply to llama-style models only")
        if not self.is_moe and any(getattr(self, f) for f in _MOE_ONLY):
            raise ConfigError(f"{self.name}: {', '.join(f for f in _MOE_ONLY if getattr(self, f))} apply to "
                              "mixtures of experts only")
        if self.dropout is not None and not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"{self.name}: dropout must be in [0, 1), got {self.dropout}")
        if self.dropout and self.family == "vit":
            raise ConfigError(f"{self.name}: parplan's ViT has no dropout")
        if self.activation not in ("silu", "gelu"):
            raise ConfigError(f"{self.name}: activation must be silu or gelu, got {self.activation!r}")
        for f in ("sliding_window", "global_every", "shared_experts", "dense_layers", "dense_ffn", "q_lora_rank",
                  "kv_lora_rank", "qk_rope_dim", "v_head_dim"):
            if getattr(self, f) < 0:
                raise ConfigError(f"{self.name}: {f} must be >= 0, got {getattr(self, f)}")
        if self.global_every and not self.sliding_window:
            raise ConfigError(f"{self.name}: global_every needs a sliding_window")
        if self.dense_layers and (self.dense_ffn <= 0 or self.dense_layers > self.layers):
            raise ConfigError(f"{self.name}: dense_layers needs 0 < dense_ffn and dense_layers <= layers")
        mla = (self.q_lora_rank, self.qk_rope_dim, self.v_head_dim)
        if self.kv_lora_rank and (self.qk_rope_dim <= 0 or self.v_head_dim <= 0 or self.kv_heads not in
                                  (None, self.heads)):
            raise ConfigError(f"{self.name}: multi-head latent attention needs qk_rope_dim > 0, v_head_dim > 0 "
                              "and as many key/value heads as heads")
        if not self.kv_lora_rank and any(mla):
            raise ConfigError(f"{self.name}: q_lora_rank, qk_rope_dim and v_head_dim need kv_lora_rank > 0")
        if self.kv_lora_rank and (self.qkv_bias or self.attention_bias or self.linear_biases):
            raise ConfigError(f"{self.name}: multi-head latent attention has no q/k/v biases")

    @property
    def norm_kind(self) -> Norm:
        """The decoder's normalisation: ``norm``, else the family's (GPT: LayerNorm; Llama-style: RMSNorm)."""
        return self.norm or family_decoder(self.family)[0]

    @property
    def position_kind(self) -> Positions:
        """The decoder's positions: ``positions``, else the family's (GPT: learned; Llama-style: RoPE)."""
        return self.positions or family_decoder(self.family)[1]

    @property
    def linear_biases(self) -> bool:
        """Whether the decoder's linear layers have biases: ``linear_bias``, else the family's (GPT's do)."""
        return family_decoder(self.family)[2] if self.linear_bias is None else self.linear_bias

    @property
    def dropout_p(self) -> float:
        """The dropout probability the model trains with: ``dropout``, else 0.1 for GPT, BERT and T5
        (Megatron-LM's, Hugging Face's) and none for the Llama-style families and ViT."""
        return architecture_dropout({"family": self.family, "dropout": self.dropout})

    def is_global_attention(self, layer: int) -> bool:
        """Whether block ``layer`` (from 0) attends to the whole sequence rather than a window."""
        return not self.sliding_window or (self.global_every > 0 and (layer + 1) % self.global_every == 0)

    @property
    def is_moe(self) -> bool:
        """Whether the MLPs (after the first ``dense_layers``) are routed experts."""
        return self.family == "mixtral" or self.num_experts > 0

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

    @property
    def mla(self) -> bool:
        """Whether attention is multi-head latent attention."""
        return self.kv_lora_rank > 0

    def with_(self, **changes: object) -> TransformerConfig:
        """A copy with some fields changed (validated again)."""
        return replace(self, **changes)  # type: ignore[arg-type]


def architecture_dropout(arch: Mapping[str, Any]) -> float:
    """The dropout probability of an architecture (a :class:`TransformerConfig`'s fields): its
    ``dropout``, else 0.1 for GPT, BERT and T5 and none for the other families."""
    p = arch.get("dropout")
    if p is not None:
        return float(p)
    return 0.1 if arch.get("family") in ("gpt", "bert", "t5") else 0.0


def dropout_field(family: str, p: float | None) -> float | None:
    """A dropout probability ``p`` read from a trainer's or a model's config, as a
    :class:`TransformerConfig`'s ``dropout``: None where it is absent or the ``family``'s usual, so
    that a config with its family's dropout equals the preset."""
    return None if p is None or p == architecture_dropout({"family": family}) else p


def extra_features(arch: Mapping[str, Any] | None) -> list[str]:
    """What of :data:`EXTRA_FEATURES` an architecture (a :class:`TransformerConfig`'s fields, e.g. a
    plan document's ``model.architecture``) uses, described; GeGLU counts too."""
    arch = arch or {}
    out = [desc for field, desc in EXTRA_FEATURES.items() if arch.get(field)]
    if arch.get("family") == "gpt" and arch.get("num_experts"):
        out.append("GELU experts of a GPT (Megatron-LM's --num-experts without --swiglu)")
    if arch.get("activation", "silu") != "silu":
        out.append(f"a {arch['activation']}-gated MLP (Gemma)")
    return out


def decoder_fields(family: str, norm: Norm, positions: Positions, linear_bias: bool) -> dict[str, Any]:
    """A decoder's normalisation, positions and linear biases read from a trainer's config, as a
    :class:`TransformerConfig`'s ``norm``, ``positions`` and ``linear_bias``: None where they are
    the ``family``'s own, so that a config with its family's choices equals the preset."""
    own_norm, own_positions, own_bias = family_decoder(family)
    return {"norm": None if norm == own_norm else norm, "positions": None if positions == own_positions else positions,
            "linear_bias": None if linear_bias == own_bias else linear_bias}


def family_decoder(family: str) -> tuple[Norm, Positions, bool]:
    """A family's own normalisation, positions and linear biases: GPT's LayerNorm, learned positions
    and biases; the Llama-style families' RMSNorm, RoPE and none."""
    gpt = family == "gpt"
    return ("layernorm" if gpt else "rmsnorm", "learned" if gpt else "rope", gpt)


def decoder_variants(arch: Mapping[str, Any] | None) -> list[str]:
    """The normalisation, positions and linear biases an architecture (a :class:`TransformerConfig`'s
    fields) sets other than its family's own, described (empty for the family's own)."""
    arch = arch or {}
    family = str(arch.get("family"))
    own = dict(zip(("norm", "positions", "linear_bias"), family_decoder(family), strict=True))
    words = {"norm": "normalisation", "positions": "positions", "linear_bias": "linear biases"}
    out = []
    for field, what in words.items():
        value = arch.get(field)
        if value is not None and value != own[field]:
            shown, theirs = (("on" if value else "off"), ("on" if own[field] else "off")) if field == "linear_bias" \
                else (value, own[field])
            out.append(f"{what} {shown} (the {family} family's: {theirs})")
    return out

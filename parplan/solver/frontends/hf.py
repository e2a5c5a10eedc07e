"""Import a Hugging Face ``config.json`` as a :class:`TransformerConfig`.

Shape fields are read, and the dropout probabilities (GPT-2's ``resid_pdrop`` / ``embd_pdrop`` /
``attn_pdrop``, Llama-style ``attention_dropout``, BERT's and ViT's ``hidden_dropout_prob`` /
``attention_probs_dropout_prob``, T5's ``dropout_rate``): parplan's model has one dropout for every
position, so the largest of those given stands for all (any above 0 prices every dropout's kernels
and masks: an upper bound where the config drops out in fewer places); none given: the family's
usual (:meth:`TransformerConfig.dropout_p`). Other training-only settings (rope scaling, Mistral's
and Qwen's sliding window, ...) are ignored. Qwen2 adds biases to q, k and v; Qwen3 normalises q and k per
head (RMSNorm over the head dim). The sequence length defaults to the model's maximum positions.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from parplan.solver.errors import ConfigError
from parplan.solver.frontends.config import TransformerConfig, dropout_field

_Mapper = Callable[[Mapping[str, Any], str, str, int | None], TransformerConfig]


def _int(cfg: Mapping[str, Any], key: str, mt: str, default: int | None = None) -> int:
    """``cfg[key]`` as an int; ``default`` if absent or null, else :class:`ConfigError`."""
    value = cfg.get(key)
    if value is None:
        if default is None:
            raise ConfigError(f"HF config (model_type {mt!r}) is missing required field {key!r}")
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(
            f"HF config (model_type {mt!r}): field {key!r} must be a non-negative integer, got {value!r}"
        )
    return value


def _opt_int(cfg: Mapping[str, Any], key: str, mt: str) -> int | None:
    """``cfg[key]`` as an int, or ``None`` if absent or null."""
    return None if cfg.get(key) is None else _int(cfg, key, mt)


def _bool(cfg: Mapping[str, Any], key: str, mt: str, default: bool) -> bool:
    value = cfg.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ConfigError(f"HF config (model_type {mt!r}): field {key!r} must be a boolean, got {value!r}")
    return value


def _dropout(cfg: Mapping[str, Any], mt: str, family: str, *keys: str) -> float | None:
    """The largest of the dropout probabilities ``keys`` that ``cfg`` gives; None if it gives none
    or that is the ``family``'s usual (so that a config equals its preset)."""
    found: list[float] = []
    for key in keys:
        value = cfg.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
            raise ConfigError(f"HF config (model_type {mt!r}): field {key!r} must be a probability in [0, 1), "
                              f"got {value!r}")
        found.append(float(value))
    return dropout_field(family, max(found) if found else None)


def _head_dim(explicit: int | None, hidden: int, heads: int) -> int | None:
    """``None`` when the head dim is the default ``hidden // heads`` (so configs compare equal)."""
    if explicit == 0:
        raise ConfigError("head dimension must be positive, got 0")
    if explicit is None or (heads > 0 and hidden % heads == 0 and explicit == hidden // heads):
        return None
    return explicit


def _gpt2(cfg: Mapping[str, Any], mt: str, name: str, seq_len: int | None) -> TransformerConfig:
    hidden = _int(cfg, "n_embd", mt)
    return TransformerConfig(
        family="gpt",
        name=name,
        layers=_int(cfg, "n_layer", mt),
        hidden=hidden,
        heads=_int(cfg, "n_head", mt),
        ffn=_int(cfg, "n_inner", mt, default=4 * hidden),
        vocab=_int(cfg, "vocab_size", mt),
        seq_len=seq_len or _int(cfg, "n_positions", mt),
        tied_embeddings=_bool(cfg, "tie_word_embeddings", mt, True),
        dropout=_dropout(cfg, mt, "gpt", "resid_pdrop", "embd_pdrop", "attn_pdrop"),
    )


def _llama(cfg: Mapping[str, Any], mt: str, name: str, seq_len: int | None) -> TransformerConfig:
    if mt != "qwen2" and _bool(cfg, "attention_bias", mt, False):
        raise ConfigError(f"HF config (model_type {mt!r}): attention_bias true (a bias on the output "
                          f"projection too) is not modelled; only Qwen2's q/k/v biases are")
    hidden = _int(cfg, "hidden_size", mt)
    heads = _int(cfg, "num_attention_heads", mt)
    moe = mt == "mixtral"
    return TransformerConfig(
        family="mixtral" if moe else "llama",
        name=name,
        layers=_int(cfg, "num_hidden_layers", mt),
        hidden=hidden,
        heads=heads,
        kv_heads=_int(cfg, "num_key_value_heads", mt, default=heads),
        head_dim=_head_dim(_opt_int(cfg, "head_dim", mt), hidden, heads),
        ffn=_int(cfg, "intermediate_size", mt),
        vocab=_int(cfg, "vocab_size", mt),
        seq_len=seq_len or _int(cfg, "max_position_embeddings", mt),
        tied_embeddings=_bool(cfg, "tie_word_embeddings", mt, False),
        num_experts=_int(cfg, "num_local_experts", mt) if moe else 0,
        top_k=_int(cfg, "num_experts_per_tok", mt) if moe else 2,
        qkv_bias=mt == "qwen2",  # transformers' Qwen2Attention always biases q, k and v (not o)
        qk_norm=mt == "qwen3",
        dropout=_dropout(cfg, mt, "mixtral" if moe else "llama", "attention_dropout"),
    )


def _bert(cfg: Mapping[str, Any], mt: str, name: str, seq_len: int | None) -> TransformerConfig:
    return TransformerConfig(
        family="bert",
        name=name,
        layers=_int(cfg, "num_hidden_layers", mt),
        hidden=_int(cfg, "hidden_size", mt),
        heads=_int(cfg, "num_attention_heads", mt),
        ffn=_int(cfg, "intermediate_size", mt),
        vocab=_int(cfg, "vocab_size", mt),
        seq_len=seq_len or _int(cfg, "max_position_embeddings", mt),
        type_vocab=_int(cfg, "type_vocab_size", mt),
        dropout=_dropout(cfg, mt, "bert", "hidden_dropout_prob", "attention_probs_dropout_prob"),
    )


def _t5(cfg: Mapping[str, Any], mt: str, name: str, seq_len: int | None) -> TransformerConfig:
    hidden = _int(cfg, "d_model", mt)
    heads = _int(cfg, "num_heads", mt)
    layers = _int(cfg, "num_layers", mt)
    proj = cfg.get("feed_forward_proj", "relu")
    if not isinstance(proj, str) or proj.split("-")[-1] not in {"relu", "gelu", "silu", "gelu_new"}:
        raise ConfigError(f"HF config (model_type {mt!r}): unsupported feed_forward_proj {proj!r}")
    return TransformerConfig(
        family="t5",
        name=name,
        layers=layers,
        decoder_layers=_int(cfg, "num_decoder_layers", mt, default=layers),
        hidden=hidden,
        heads=heads,
        head_dim=_head_dim(_int(cfg, "d_kv", mt), hidden, heads),
        ffn=_int(cfg, "d_ff", mt),
        vocab=_int(cfg, "vocab_size", mt),
        seq_len=seq_len or _int(cfg, "n_positions", mt, default=512),
        tied_embeddings=_bool(cfg, "tie_word_embeddings", mt, True),
        gated_mlp=proj.startswith("gated-"),
        relative_buckets=_int(cfg, "relative_attention_num_buckets", mt, default=32),
        dropout=_dropout(cfg, mt, "t5", "dropout_rate"),
    )


def _vit(cfg: Mapping[str, Any], mt: str, name: str, seq_len: int | None) -> TransformerConfig:
    image, patch = _int(cfg, "image_size", mt), _int(cfg, "patch_size", mt)
    if patch <= 0:
        raise ConfigError(f"HF config (model_type {mt!r}): patch_size must be positive, got {patch}")
    id2label = cfg.get("id2label")
    classes = len(id2label) if isinstance(id2label, Mapping) and id2label else 1000
    return TransformerConfig(
        family="vit",
        name=name,
        layers=_int(cfg, "num_hidden_layers", mt),
        hidden=_int(cfg, "hidden_size", mt),
        heads=_int(cfg, "num_attention_heads", mt),
        ffn=_int(cfg, "intermediate_size", mt),
        vocab=0,
        seq_len=seq_len or (image // patch) ** 2 + 1,
        image_size=image,
        patch_size=patch,
        channels=_int(cfg, "num_channels", mt, default=3),
        num_classes=_int(cfg, "num_labels", mt, default=classes),
        dropout=_dropout(cfg, mt, "vit", "hidden_dropout_prob", "attention_probs_dropout_prob"),
    )


_MAPPERS: Mapping[str, _Mapper] = {
    "gpt2": _gpt2,
    "llama": _llama,
    "mistral": _llama,
    "mixtral": _llama,
    "qwen2": _llama,
    "qwen3": _llama,
    "bert": _bert,
    "t5": _t5,
    "vit": _vit,
}

#: ``architectures`` class-name prefixes (lower case) -> model_type, longest first.
_ARCH_PREFIXES: tuple[tuple[str, str], ...] = (
    ("qwen3", "qwen3"),
    ("qwen2", "qwen2"),
    ("mistral", "mistral"),
    ("mixtral", "mixtral"),
    ("llama", "llama"),
    ("gpt2", "gpt2"),
    ("bert", "bert"),
    ("vit", "vit"),
    ("t5", "t5"),
)


def supported_model_types() -> list[str]:
    """The HF ``model_type`` values :func:`config_from_hf` understands."""
    return sorted(_MAPPERS)


def _mapped_type(cfg: Mapping[str, Any]) -> str | None:
    """The hand-mapped model_type of ``cfg``, or None. ``architectures`` is a hint only when
    ``model_type`` is missing: ``qwen2_moe`` (``Qwen2MoeForCausalLM``) is not a dense ``qwen2``."""
    mt = cfg.get("model_type")
    if isinstance(mt, str) and mt:
        return mt.lower() if mt.lower() in _MAPPERS else None
    archs = cfg.get("architectures") or []
    for arch in archs if isinstance(archs, list) else []:
        for prefix, guess in _ARCH_PREFIXES:
            if isinstance(arch, str) and arch.lower().startswith(prefix):
                return guess
    return None


def has_mapper(cfg: Mapping[str, Any]) -> bool:
    """Whether :func:`config_from_hf` maps ``cfg`` by hand (else it can only be traced)."""
    return isinstance(cfg, Mapping) and _mapped_type(cfg) is not None


def _model_type(cfg: Mapping[str, Any]) -> str:
    found = _mapped_type(cfg)
    if found is not None:
        return found
    mt = cfg.get("model_type")
    archs = cfg.get("architectures") or []
    what = f"model_type {mt!r}" if mt is not None else "no model_type"
    raise ConfigError(
        f"unsupported HF config ({what}, architectures {archs!r}); "
        f"supported model_type values: {', '.join(supported_model_types())}"
    )


def config_from_hf(
    cfg: Mapping[str, Any], name: str | None = None, seq_len: int | None = None
) -> TransformerConfig:
    """Map a Hugging Face ``config.json`` dict to a :class:`TransformerConfig`.

    ``name`` defaults to ``_name_or_path`` or the model type; ``seq_len`` overrides the model's
    maximum positions as the training sequence length.
    """
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"HF config must be a JSON object, got {type(cfg).__name__}")
    if seq_len is not None and seq_len <= 0:
        raise ConfigError(f"seq_len must be positive, got {seq_len}")
    mt = _model_type(cfg)
    label = name or cfg.get("_name_or_path") or mt
    return _MAPPERS[mt](cfg, mt, str(label), seq_len)


def load_hf_config(
    path: str | Path, name: str | None = None, seq_len: int | None = None
) -> TransformerConfig:
    """Read a ``config.json`` file; the name defaults to its folder (``.../Llama-2-7b-hf/config.json``)."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"cannot read HF config {str(p)!r}: {e}") from e
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"HF config {str(p)!r} is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"HF config {str(p)!r} must hold a JSON object")
    if name is None and not data.get("_name_or_path"):
        name = p.parent.name if p.stem == "config" and p.parent.name else p.stem
    try:
        return config_from_hf(data, name=name, seq_len=seq_len)
    except ConfigError as e:
        raise ConfigError(f"{p}: {e}") from e

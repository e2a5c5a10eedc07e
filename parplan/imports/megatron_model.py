"""The model's kind and its decoder's normalisation, positions and linear biases from Megatron-LM's
``pretrain_gpt.py`` flags (``--swiglu``, ``--num-experts``, ``--normalization``,
``--position-embedding-type``, ``--disable-bias-linear``)."""

from __future__ import annotations

from typing import Any, Literal

from parplan.solver.frontends.config import MEGATRON_NORMS, MEGATRON_POSITIONS, decoder_fields

#: Megatron-LM's --normalization and --position-embedding-type choices parplan builds, as its own names
_NORMS = {name: norm for norm, name in MEGATRON_NORMS.items()}
_POSITIONS = {name: pos for pos, name in MEGATRON_POSITIONS.items()}


def model_family(flags: dict[str, str | bool], problems: list[str]) -> Literal["gpt", "llama", "mixtral"]:
    """The model's kind from ``--num-experts`` and ``--swiglu`` (a GPT's experts are GELU MLPs);
    ``problems`` gets a normalisation or position embedding parplan does not build."""
    norm, pos = str(flags.get("--normalization", "LayerNorm")), position_type(flags)
    if norm not in _NORMS:
        problems.append(f"--normalization {norm}: parplan builds LayerNorm and RMSNorm")
    if pos not in _POSITIONS:
        problems.append(f"--position-embedding-type {pos}: parplan builds learned_absolute, rope and none")
    if "--swiglu" not in flags:
        return "gpt"
    return "mixtral" if flags.get("--num-experts") else "llama"


def decoder(flags: dict[str, str | bool], family: str) -> dict[str, Any]:
    """The :class:`TransformerConfig` fields of ``--normalization``, ``--position-embedding-type`` and
    ``--disable-bias-linear`` (Megatron-LM's defaults LayerNorm, learned_absolute and biases; None where
    they are the family's own)."""
    return decoder_fields(family, _NORMS[str(flags.get("--normalization", "LayerNorm"))],
                          _POSITIONS[position_type(flags)], "--disable-bias-linear" not in flags)


def position_type(flags: dict[str, str | bool]) -> str:
    """``--position-embedding-type``, rope under the legacy ``--use-rotary-position-embeddings``
    (``megatron/training/arguments.py``: it sets the type to rope)."""
    if "--use-rotary-position-embeddings" in flags:
        return "rope"
    return str(flags.get("--position-embedding-type", "learned_absolute"))

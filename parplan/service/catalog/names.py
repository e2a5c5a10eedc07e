"""The names a request may use for a model preset, a GPU or a precision, as string types whose JSON
Schema is the list of them (an ``enum``), so the OpenAPI document says exactly what is accepted."""

from __future__ import annotations

import re
from functools import cache
from typing import Annotated

from pydantic import AfterValidator, WithJsonSchema

from parplan.solver.cluster import GPU_PRESETS
from parplan.solver.cost.precision import PRECISIONS
from parplan.solver.frontends.presets import PRESETS


@cache
def gpu_names() -> tuple[str, ...]:
    """Each GPU preset's name, in upper and lower case, and its family's name (``H100``, ``h100``)
    when no other preset shares the family."""
    families: dict[str, list[str]] = {}
    for name in GPU_PRESETS:
        families.setdefault(re.sub(r"-\d+GB$", "", name), []).append(name)
    out: list[str] = []
    for name in GPU_PRESETS:
        out += [name, name.lower()]
    for family, members in families.items():
        if len(members) == 1 and family not in GPU_PRESETS:
            out += [family, family.lower()]
    return tuple(dict.fromkeys(out))


def _known_gpu(name: str) -> str:
    if name not in gpu_names():
        raise ValueError(f"unknown GPU {name!r}; known GPUs: {', '.join(GPU_PRESETS)}")
    return name


def _known_preset(name: str) -> str:
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; known presets: {', '.join(PRESETS)}")
    return name


def _known_precision(name: str) -> str:
    if name not in PRECISIONS:
        raise ValueError(f"unknown precision {name!r}; known: {', '.join(PRECISIONS)}")
    return name


GpuName = Annotated[str, AfterValidator(_known_gpu), WithJsonSchema(
    {"type": "string", "enum": list(gpu_names()), "description": "A GPU preset (GET /v1/clusters/presets); "
     "lower case and the short name of a one-size family (h100) are accepted too."})]
PresetName = Annotated[str, AfterValidator(_known_preset), WithJsonSchema(
    {"type": "string", "enum": list(PRESETS), "description": "A model preset (GET /v1/models)."})]
PrecisionName = Annotated[str, AfterValidator(_known_precision), WithJsonSchema(
    {"type": "string", "enum": list(PRECISIONS), "default": "bf16", "description": "Training precision: bf16 "
     "(Megatron-LM's default), bf16-grad16, fp16, fp16-grad16, fp32, fp8 (Transformer Engine's FP8 recipe, "
     "delayed scaling) or fp8-cs (the same with current scaling); FP8 needs a GPU with FP8 math."})]

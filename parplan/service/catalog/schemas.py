"""Wire shapes of the preset catalogues."""

from __future__ import annotations

from pydantic import BaseModel


class ModelPreset(BaseModel):
    name: str
    family: str
    parameters: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq_len: int
    experts: int


class ModelList(BaseModel):
    models: list[ModelPreset]


class LinkOut(BaseModel):
    bandwidth_bytes_per_s: float
    latency_seconds: float


class GpuPreset(BaseModel):
    name: str
    memory_bytes: int
    peak_flops: dict[str, float]
    hbm_bandwidth_bytes_per_s: float
    intra_node: LinkOut
    inter_node: LinkOut
    default_gpus_per_node: int


class GpuList(BaseModel):
    gpus: list[GpuPreset]

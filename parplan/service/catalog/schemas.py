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
    #: GPUs one machine holds where fewer than a node's NVLink domain (a GB200 compute tray's 4 of 72):
    #: what trainers' launchers count as a node; null where a node is one machine
    gpus_per_host: int | None = None


class GpuList(BaseModel):
    gpus: list[GpuPreset]

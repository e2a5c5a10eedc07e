"""Wire shape of an evaluation request: a trainer's configuration file's text and what it leaves out."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from parplan.solver.request import (
    AS_INT,
    DEFAULT_GPU,
    MAX_DEVICES,
    MAX_HOST_MEMORY_GIB,
    MAX_MEMORY_GIB,
    MIN_MEMORY_GIB,
    GpuName,
    ModelSpec,
    PositiveInteger,
)


class EvaluationCluster(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    gpus: Annotated[int, Field(ge=1, le=MAX_DEVICES), AS_INT] | None = Field(
        default=None, description="Number of devices (default: from the file's torchrun line, when it has one).")
    gpus_per_node: PositiveInteger | None = Field(default=None,
                                                  description="Default: the file's, else the GPU preset's.")
    gpu: GpuName = Field(default=DEFAULT_GPU, description="GET /v1/clusters/presets")
    gpu_memory_gib: float | None = Field(default=None, ge=MIN_MEMORY_GIB, le=MAX_MEMORY_GIB,
                                         description="Override the device memory.")
    host_memory_gib: float | None = Field(default=None, ge=MIN_MEMORY_GIB, le=MAX_HOST_MEMORY_GIB,
                                          description="Override one machine's host memory (an offloaded optimizer's).")


class EvaluationIn(BaseModel):
    """A trainer's configuration as its file's text: Megatron-LM arguments (or their torchrun line),
    a DeepSpeed ``ds_config.json`` (give ``model``), torchtitan 0.3.0 arguments or a TOML job file of
    an earlier torchtitan release (give ``cluster.gpus``), Galvatron's ``galvatron_config.json``
    (give ``model``; ``launch``: its launch script), or a nanotron YAML config."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [
        {"kind": "ds-config", "text": '{"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, '
                                      '"zero_optimization": {"stage": 3}, "bf16": {"enabled": true}}',
         "model": {"preset": "llama-2-7b"}, "cluster": {"gpus": 8}}]})

    kind: Literal["megatron-args", "ds-config", "torchtitan-config", "galvatron-config", "nanotron-config"]
    text: str = Field(min_length=1, max_length=1 << 20, description="The file's text.")
    launch: str | None = Field(default=None, max_length=1 << 20,
                               description="galvatron-config: the launch script's text (its sequence parallelism, "
                                           "precision and flash attention flags).")
    model: ModelSpec | None = Field(default=None, description="The model, when the file does not describe it.")
    cluster: EvaluationCluster = Field(default_factory=EvaluationCluster)
    seq_len: Annotated[int, Field(ge=1, le=1 << 24), AS_INT] | None = Field(
        default=None, description="Tokens per sample (ds-config).")

"""A torchtitan job as its trainer resolves it, whatever file it was read from (a command line or a
TOML job file), and the settings of one that parplan does not model."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from parplan.exports.torchtitan import Flavor

KIND = "torchtitan-config"

#: ``parallelism.spmd_backend`` values of torchtitan 0.3.0 (priced alike).
SPMD_BACKENDS = ("spmd_types", "partial_dtensor", "full_dtensor")


@dataclass(frozen=True)
class Job:
    """A torchtitan job as its trainer resolves it, before the degrees: the model's flavor, every field
    of :data:`TRAINER_DEFAULTS` (text), activation checkpointing (``none``, ``full``, ``selective``:
    per operator, or a layer interval ``"2"``...), the modules per pipeline stage when given, and what
    was said about the file."""

    flavor: Flavor
    values: Mapping[str, str]
    ac: str
    parts: tuple[str, ...]
    world: int
    per_node: int | None
    adjusted: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    unpriced: list[str] = field(default_factory=list)
    #: the parplan precision of its torchao Float8 linear layers (``fp8-torchao``...), None without
    float8: str | None = None


def unmodelled(values: Mapping[str, str]) -> list[str]:
    """The settings parplan does not price as torchtitan would run them, each named."""
    problems: list[str] = []
    if values["training.dtype"] != "float32":
        problems.append(f"training.dtype {values['training.dtype']}: parplan keeps float32 weights and "
                        "optimizer states")
    if values["training.mixed_precision_reduce"] != "float32":
        problems.append(f"gradients reduced in {values['training.mixed_precision_reduce']} "
                        "(training.mixed_precision_reduce)")
    flags = {"training.enable_cpu_offload": "CPU offloading of weights, gradients and optimizer states",
             "parallelism.enable_fsdp_symm_mem": "FSDP2's symmetric-memory buffers",
             "compile.enable": "torch.compile (its fusions keep fewer activations than the eager kernels priced)",
             "compile.enable_async_tensor_parallel": "async tensor parallelism"}
    problems += [f"{key}: {what} is not modelled" for key, what in flags.items() if values[key] == "true"]
    for key, what in (("parallelism.context_parallel_degree", "context parallelism is not modelled for torchtitan"),
                      ("parallelism.expert_parallel_degree", "expert parallelism of a dense Llama")):
        if values[key] != "1":
            problems.append(f"{key} {values[key]}: {what}")
    if values["loss.num_chunks"] != "8":
        problems.append(f"loss.num_chunks {values['loss.num_chunks']}: parplan prices ChunkedLossWrapper's 8 chunks")
    if values["parallelism.pipeline_parallel_schedule_csv"]:
        problems.append("parallelism.pipeline_parallel_schedule_csv: a schedule from a file is not modelled")
    if values["parallelism.spmd_backend"] not in SPMD_BACKENDS:
        problems.append(f"parallelism.spmd_backend {values['parallelism.spmd_backend']} (torchtitan 0.3.0 has "
                        f"{', '.join(SPMD_BACKENDS)})")
    return problems

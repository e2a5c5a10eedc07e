"""DeepSpeed's ``ds_config.json``: data parallelism with a ZeRO stage, batch sizes and precision.

The file does not describe the model (it is the training script's) nor tensor or pipeline
parallelism (the model's own code), so the model and GPU count come from the caller; every GPU is
a data-parallel rank. ``activation_checkpointing`` present means the script checkpoints every block
(full recomputation). Keys that change memory or time and are not modelled (offloading, ZeRO++
partitions, MiCS) are errors; optimizer, scheduler and logging keys are listed in ``ignored``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from parplan.imports.common import Imported, ImportProblemError, json_object, refusals_as_problems
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.runtime import DEEPSPEED_BUCKET_ELEMENTS, Runtime
from parplan.solver.models import ModelSource
from parplan.solver.strategy import ParallelConfig

KIND = "ds-config"

_USED = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "zero_optimization",
         "bf16", "fp16", "activation_checkpointing"}
_IGNORED = {"optimizer", "scheduler", "gradient_clipping", "steps_per_print", "wall_clock_breakdown",
            "prescale_gradients", "tensorboard", "wandb", "csv_monitor", "flops_profiler", "comms_logger",
            "zero_allow_untested_optimizer", "dump_state", "seed", "checkpoint", "data_efficiency",
            "gradient_predivide_factor", "communication_data_type", "amp"}
#: ZeRO keys that change what a device holds and are not modelled
_ZERO_UNMODELLED = {"offload_param", "offload_optimizer", "zero_hpz_partition_size", "zero_quantized_weights",
                    "zero_quantized_gradients", "mics_shard_size", "cpu_offload", "cpu_offload_params"}


def read_ds_config(text: str, model: ModelSource | None, gpus: int | None, seq_len: int | None = None) -> Imported:
    """The strategy of a DeepSpeed config on ``gpus`` data-parallel ranks, for ``model``."""
    cfg = json_object(KIND, text)
    problems: list[str] = []
    if model is None:
        problems.append("the model: give --model (a DeepSpeed config does not describe it)")
    if gpus is None:
        problems.append("the GPU count: give --gpus")
    unknown = sorted(k for k in cfg if k not in _USED and k not in _IGNORED)
    ignored = sorted(k for k in cfg if k in _IGNORED)
    zero = cfg.get("zero_optimization") or {}
    if not isinstance(zero, Mapping):
        problems.append("zero_optimization must be an object")
        zero = {}
    # ZeRO settings the prediction does not read (overlap, contiguous gradients, ...): said, not dropped
    ignored += sorted(f"zero_optimization.{k}" for k in zero
                      if k != "stage" and k not in _ZERO_UNMODELLED and k not in _BUCKET_DEFAULTS)
    stage = zero.get("stage", 0)
    if stage not in (0, 1, 2, 3):
        problems.append(f"zero_optimization.stage {stage!r}")
    for key in sorted(_ZERO_UNMODELLED & set(zero)):
        value = zero[key]
        device = value.get("device") if isinstance(value, Mapping) else value
        if device not in (None, "none", False, 0, 1):
            problems.append(f"zero_optimization.{key} ({value!r}) is not modelled")
    bf16 = bool((cfg.get("bf16") or {}).get("enabled")) if isinstance(cfg.get("bf16"), Mapping) else False
    fp16 = bool((cfg.get("fp16") or {}).get("enabled")) if isinstance(cfg.get("fp16"), Mapping) else False
    if bf16 and fp16:
        problems.append("both bf16 and fp16 enabled")
    if problems:
        raise ImportProblemError(KIND, problems)
    assert gpus is not None and model is not None
    mb = _positive(cfg, "train_micro_batch_size_per_gpu", 1)
    gas = _positive(cfg, "gradient_accumulation_steps", None)
    batch = _positive(cfg, "train_batch_size", None)
    if gas is None:
        gas = batch // (mb * gpus) if batch is not None and batch % (mb * gpus) == 0 else 1
    if batch is not None and batch != mb * gas * gpus:
        raise ImportProblemError(KIND, [f"train_batch_size {batch} is not train_micro_batch_size_per_gpu {mb} x "
                                   f"gradient_accumulation_steps {gas} x {gpus} GPUs"])
    with refusals_as_problems(KIND):
        strategy = ParallelConfig(dp=gpus, zero=int(stage), micro_batch=mb, num_microbatches=gas,
                                  recompute=Recompute.FULL if cfg.get("activation_checkpointing") is not None
                                  else Recompute.SELECTIVE,
                                  precision="bf16" if bf16 else ("fp16" if fp16 else "fp32"),
                                  runtime=Runtime.DEEPSPEED)
    return Imported(KIND, model, strategy, seq_len, gpus, None, "deepspeed", unknown, ignored,
                    _larger_buckets(zero, int(stage)))


#: DeepSpeed 0.19.8's defaults of the buckets the deepspeed runtime prices (elements)
_BUCKET_DEFAULTS = {"reduce_bucket_size": 500_000_000, "allgather_bucket_size": 500_000_000,
                    "stage3_prefetch_bucket_size": 50_000_000, "stage3_max_live_parameters": 1_000_000_000,
                    "stage3_max_reuse_distance": 1_000_000_000}


def _larger_buckets(zero: Mapping[str, Any], stage: int) -> list[str]:
    """Buckets larger than the runtime prices (set, or DeepSpeed's default when not set)."""
    out = []
    for key, default in _BUCKET_DEFAULTS.items():
        if (key.startswith("stage3_") and stage != 3) or (key == "allgather_bucket_size" and stage == 3):
            continue
        value = zero.get(key, default)
        if isinstance(value, int | float) and value > DEEPSPEED_BUCKET_ELEMENTS:
            where = "set" if key in zero else "DeepSpeed's default"
            out.append(f"zero_optimization.{key} = {value:,.0f} ({where}) is larger than the "
                       f"{DEEPSPEED_BUCKET_ELEMENTS:,} elements priced: the run can hold more than predicted")
    return out


def _positive(cfg: Mapping[str, Any], key: str, default: int | None) -> Any:
    v = cfg.get(key)
    if v is None or v == "auto":  # not given (null and "auto" leave it to DeepSpeed): the default
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ImportProblemError(KIND, [f"{key} must be a positive integer, got {v!r}"])
    return v

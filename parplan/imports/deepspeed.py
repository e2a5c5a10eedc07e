"""DeepSpeed's ``ds_config.json``: data parallelism with a ZeRO stage, batch sizes and precision.

The file does not describe the model (it is the training script's) nor tensor or pipeline
parallelism (the model's own code), so the model and GPU count come from the caller; every GPU is
a data-parallel rank. ``activation_checkpointing`` present means the script checkpoints every block
(full recomputation). Keys that change memory or time and are not modelled (offloading, ZeRO++
partitions, MiCS, parameter offloading) are errors; ZeRO-Offload of the whole optimizer to the CPU is
read; optimizer, scheduler and logging keys are listed in ``ignored``.
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
         "bf16", "fp16", "activation_checkpointing", "optimizer", "torch_autocast"}
_IGNORED = {"scheduler", "gradient_clipping", "steps_per_print", "wall_clock_breakdown",
            "prescale_gradients", "tensorboard", "wandb", "csv_monitor", "flops_profiler", "comms_logger",
            "zero_allow_untested_optimizer", "dump_state", "seed", "checkpoint", "data_efficiency",
            "gradient_predivide_factor", "communication_data_type", "amp"}
#: ZeRO keys that change what a device holds and are not modelled
_ZERO_UNMODELLED = {"offload_param", "offload_optimizer", "zero_hpz_partition_size", "zero_quantized_weights",
                    "zero_quantized_gradients", "mics_shard_size", "cpu_offload", "cpu_offload_params"}
#: top-level sections that change memory or time in ways parplan does not model (refused when enabled)
_UNMODELLED = {"progressive_layer_drop": "layers skipped at random", "sparse_attention": "sparse attention",
               "compression_training": "quantisation and pruning", "pipeline": "DeepSpeed's pipeline engine",
               "data_types": "gradient accumulation in another type"}
#: DeepSpeed's optimizers whose states are Adam's two moments per parameter, as parplan prices them
_ADAM = {"adam", "adamw", "fusedadam"}
#: the ``bf16`` keys priced (``enabled``, and the low-precision master weights and optimizer states)
_BF16_KEYS = {"enabled", "bf16_master_weights_and_grads", "bf16_optimizer_states"}


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
    adjusted: list[str] = []
    unpriced: list[str] = []
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
    offload = _optimizer_offload(zero, problems, ignored)
    for key in sorted(_ZERO_UNMODELLED & set(zero) - _OFFLOAD_KEYS):
        value = zero[key]
        device = value.get("device") if isinstance(value, Mapping) else value
        if device not in (None, "none", False, 0, 1):
            problems.append(f"zero_optimization.{key} ({value!r}) is not modelled")
    if zero.get("zenflow") is not None:
        problems.append("zero_optimization.zenflow (ZenFlow's CPU optimizer steps) is not modelled")
    for key, what in _UNMODELLED.items():
        section = cfg.get(key)
        if section is not None and (not isinstance(section, Mapping) or section.get("enabled", True)):
            problems.append(f"{key} ({what}) is not modelled")
    precision = _precision(cfg, stage, problems, adjusted, unknown)
    ignored += sorted(f"fp16.{k}" for k in _section(cfg, "fp16")
                      if k not in ("enabled", "fp16_master_weights_and_grads"))
    _optimizer(cfg, problems, adjusted, ignored)
    _autocast(cfg, precision, unpriced, ignored)
    if problems:
        raise ImportProblemError(KIND, problems)
    assert gpus is not None and model is not None
    mb, gas = _batch(cfg, gpus, adjusted)
    with refusals_as_problems(KIND):
        strategy = ParallelConfig(dp=gpus, zero=int(stage), micro_batch=mb, num_microbatches=gas,
                                  recompute=Recompute.FULL if cfg.get("activation_checkpointing") is not None
                                  else Recompute.SELECTIVE,
                                  precision=precision, runtime=Runtime.DEEPSPEED, optimizer_offload=offload)
    buckets = _resolved_buckets(zero, model, adjusted)
    return Imported(KIND, model, strategy, seq_len, gpus, None, "deepspeed", unknown, ignored,
                    unpriced + _larger_buckets(buckets, int(stage)), adjusted)


#: ZeRO-Offload's keys: ``offload_optimizer`` and its legacy switch ``cpu_offload``
_OFFLOAD_KEYS = {"offload_optimizer", "cpu_offload"}


def _optimizer_offload(zero: Mapping[str, Any], problems: list[str], ignored: list[str]) -> float:
    """The fraction of the optimizer ZeRO-Offload keeps on the host: 1 with ``offload_optimizer.device``
    cpu (or the legacy ``cpu_offload: true``), 0 without; NVMe and a partial ``ratio`` are not modelled."""
    value = zero.get("offload_optimizer")
    if isinstance(value, Mapping):
        device = value.get("device")
        ratio = value.get("ratio", 1)
        ignored += sorted(f"zero_optimization.offload_optimizer.{k}" for k in value if k not in ("device", "ratio"))
        if device in (None, "none"):
            return 0.0
        if device != "cpu":
            problems.append(f"zero_optimization.offload_optimizer.device {device!r} (only the CPU is modelled)")
        elif ratio != 1:
            problems.append(f"zero_optimization.offload_optimizer.ratio {ratio!r} (a partial offload) is not modelled")
        return 1.0
    if value not in (None, False, "none"):
        problems.append(f"zero_optimization.offload_optimizer ({value!r}) must be an object")
    return 1.0 if zero.get("cpu_offload") is True else 0.0


def _section(cfg: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = cfg.get(key)
    return value if isinstance(value, Mapping) else {}


def _precision(cfg: Mapping[str, Any], stage: Any, problems: list[str], adjusted: list[str],
               unknown: list[str]) -> str:
    """parplan's precision for the ``bf16`` and ``fp16`` sections (DeepSpeed's ``runtime/config.py``:
    ``bf16_master_weights_and_grads`` needs ZeRO 1-3, ``bf16_optimizer_states`` needs it; without
    the optimizer states in bf16 the master weights need ZeRO-Offload, see ``base_optimizer.py``'s
    ``_configure_master_weights``)."""
    bf16, fp16 = _section(cfg, "bf16"), _section(cfg, "fp16")
    for name, section in (("bf16", bf16), ("fp16", fp16)):
        if section.get("enabled") == "auto":
            problems.append(f"{name}.enabled \"auto\": the Hugging Face Trainer fills it from its own --{name} "
                            "argument, which the config does not hold; give true or false")
    unknown += sorted(f"bf16.{k}" for k in bf16 if k not in _BF16_KEYS)
    on16 = bool(fp16.get("enabled")) and fp16.get("enabled") != "auto"
    on_bf16 = bool(bf16.get("enabled")) and bf16.get("enabled") != "auto"
    if on_bf16 and on16:
        problems.append("both bf16 and fp16 enabled")
    if fp16.get("fp16_master_weights_and_grads"):
        problems.append("fp16.fp16_master_weights_and_grads (fp16 master weights and gradients) is not modelled")
    master, states = bool(bf16.get("bf16_master_weights_and_grads")), bool(bf16.get("bf16_optimizer_states"))
    if not on_bf16 or not (master or states):
        return "bf16" if on_bf16 else ("fp16" if on16 else "fp32")
    if stage not in (1, 2, 3):
        problems.append("bf16.bf16_master_weights_and_grads needs ZeRO stage 1, 2 or 3 (DeepSpeed refuses stage 0)")
    elif not master:
        problems.append("bf16.bf16_optimizer_states needs bf16.bf16_master_weights_and_grads (DeepSpeed refuses it)")
    elif not states:
        problems.append("bf16.bf16_master_weights_and_grads with fp32 optimizer states: DeepSpeed keeps those on "
                        "the CPU (ZeRO-Offload), which is not modelled")
    else:
        adjusted.append("bf16.bf16_master_weights_and_grads and bf16.bf16_optimizer_states: master weights, "
                        "gradients and Adam's moments in bf16 (precision bf16-states16, 10 bytes per parameter)")
    return "bf16-states16"


def _optimizer(cfg: Mapping[str, Any], problems: list[str], adjusted: list[str], ignored: list[str]) -> None:
    """Adam's states are what parplan prices; another optimizer's are refused by name."""
    opt = cfg.get("optimizer")
    if opt is None:
        adjusted.append("no optimizer section: the training script's own optimizer, priced as Adam (two moments "
                        "per parameter)")
        return
    kind = str(opt.get("type", "")) if isinstance(opt, Mapping) else ""
    if isinstance(opt, Mapping) and "params" in opt:
        ignored.append("optimizer.params")  # learning rate, betas, weight decay: no memory or time
    if kind.lower() not in _ADAM:
        problems.append(f"optimizer.type {kind or opt!r}: parplan prices Adam's states (Adam, AdamW)")


def _autocast(cfg: Mapping[str, Any], precision: str, unpriced: list[str], ignored: list[str]) -> None:
    """``torch_autocast``: off changes nothing; on, over a bf16 model, autocast runs the operators of
    its fp32 list (layer norms, softmax, the loss) in fp32, whose outputs the prediction counts in bf16."""
    section = _section(cfg, "torch_autocast")
    if "torch_autocast" not in cfg:
        return
    if not section.get("enabled"):
        ignored.append("torch_autocast")
        return
    if precision == "fp32":
        raise ImportProblemError(KIND, ["torch_autocast over an fp32 model (fp32 weights, 16-bit compute) is not "
                                        "modelled"])
    dtype = str(section.get("dtype", "bfloat16"))
    unpriced.append(f"torch_autocast ({dtype}) over a {precision} model: the operators autocast runs in fp32 "
                    "(layer norms, softmax, the loss) keep fp32 outputs, counted here in the model's 16-bit type")


def _batch(cfg: Mapping[str, Any], gpus: int, adjusted: list[str]) -> tuple[int, int]:
    """(micro-batch, accumulation steps) as DeepSpeed derives them (``runtime/config.py``'s
    ``_set_batch_related_parameters``): any two of the three sizes give the third; the micro-batch
    alone gives one accumulation step. ``"auto"`` is the Hugging Face Trainer's placeholder: resolved
    the same way from the sizes given, else refused."""
    keys = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    batch, mb, gas = (_positive(cfg, k) for k in keys)
    auto = [k for k in keys if cfg.get(k) == "auto"]
    if mb is None and batch is not None and gas is not None:
        mb = batch // (gas * gpus) if batch % (gas * gpus) == 0 else None
    elif gas is None and batch is not None and mb is not None:
        gas = batch // (mb * gpus) if batch % (mb * gpus) == 0 else None
    elif gas is None and mb is not None and "gradient_accumulation_steps" not in auto:
        gas = 1
    elif mb is None and batch is not None and not auto:
        mb, gas = (batch // gpus, 1) if batch % gpus == 0 else (None, 1)
    if mb is None or gas is None:
        if auto:
            raise ImportProblemError(KIND, [f"{', '.join(auto)} \"auto\": the Hugging Face Trainer fills it from its "
                                            "own arguments, which the config does not hold, and the sizes given do "
                                            "not determine it; give a number"])
        raise ImportProblemError(KIND, ["the batch: give train_micro_batch_size_per_gpu or train_batch_size "
                                        f"(a multiple of the {gpus} GPUs)"])
    if batch is not None and batch != mb * gas * gpus:
        raise ImportProblemError(KIND, [f"train_batch_size {batch} is not train_micro_batch_size_per_gpu {mb} x "
                                        f"gradient_accumulation_steps {gas} x {gpus} GPUs"])
    for key in auto:
        value = {"train_batch_size": mb * gas * gpus, "train_micro_batch_size_per_gpu": mb,
                 "gradient_accumulation_steps": gas}[key]
        adjusted.append(f"{key} \"auto\": {value}, as DeepSpeed derives it from the other batch sizes")
    return mb, gas


def _positive(cfg: Mapping[str, Any], key: str) -> int | None:
    """A batch size given as a number; None when absent, null or ``"auto"`` (resolved by :func:`_batch`)."""
    v = cfg.get(key)
    if v is None or v == "auto":
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ImportProblemError(KIND, [f"{key} must be a positive integer, got {v!r}"])
    return v


#: DeepSpeed 0.19.8's defaults of the buckets the deepspeed runtime prices (elements)
_BUCKET_DEFAULTS = {"reduce_bucket_size": 500_000_000, "allgather_bucket_size": 500_000_000,
                    "stage3_prefetch_bucket_size": 50_000_000, "stage3_max_live_parameters": 1_000_000_000,
                    "stage3_max_reuse_distance": 1_000_000_000}
#: the Hugging Face Trainer's values for ``"auto"`` buckets, from the model's hidden size h
#: (``transformers.integrations.deepspeed``: ``reduce_bucket_size = h * h``,
#: ``stage3_prefetch_bucket_size = 0.9 * h * h``)
_AUTO_BUCKETS = {"reduce_bucket_size": 1.0, "stage3_prefetch_bucket_size": 0.9}


def _resolved_buckets(zero: Mapping[str, Any], model: ModelSource, adjusted: list[str]) -> dict[str, Any]:
    """The bucket sizes with ``"auto"`` resolved as the Hugging Face Trainer resolves them."""
    out = dict(zero)
    for key, value in zero.items():
        if value != "auto" or key not in _BUCKET_DEFAULTS:
            continue
        if key not in _AUTO_BUCKETS or model.config is None:
            raise ImportProblemError(KIND, [f"zero_optimization.{key} \"auto\": filled by the Hugging Face Trainer "
                                            "from the model; give a number"])
        h = model.config.hidden
        out[key] = int(_AUTO_BUCKETS[key] * h * h)
        adjusted.append(f"zero_optimization.{key} \"auto\": {out[key]:,} elements (the Hugging Face Trainer's "
                        f"{_AUTO_BUCKETS[key]:g} x hidden {h} squared)")
    return out


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

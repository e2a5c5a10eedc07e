"""TOML job files of torchtitan before 0.3.0 (``train_configs/*.toml``, read by ``--job.config_file``
in releases 0.1.0 to 0.2.2), read as the settings of a torchtitan job and priced as torchtitan 0.3.0
runs those settings (its runtime is the one parplan models): the fields that have a 0.3.0 equivalent
are mapped to it, the release's own defaults (``JobConfig`` in ``torchtitan/config/job_config.py``,
v0.2.2; ``torchtitan/config_manager.py``, v0.1.0) fill what the file leaves out, and every field
that would change memory or time under a value parplan does not model refuses the import.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from typing import Any

from parplan.exports.torchtitan import FLAVORS, Flavor
from parplan.imports.common import ImportProblemError
from parplan.imports.torchtitan_job import KIND, Job, unmodelled
from parplan.imports.torchtitan_recipes import TRAINER_DEFAULTS

#: file fields -> the 0.3.0 field they set (the same name where none is given)
_PRICED: Mapping[str, str] = {
    **{f"training.{f}": f"training.{f}" for f in (
        "local_batch_size", "global_batch_size", "seq_len", "dtype", "mixed_precision_param",
        "mixed_precision_reduce", "enable_cpu_offload")},
    "training.compile": "compile.enable",  # v0.1.0: Training.compile: bool = False
    **{f"parallelism.{f}": f"parallelism.{f}" for f in (
        "data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
        "tensor_parallel_degree", "pipeline_parallel_degree", "pipeline_parallel_first_stage_less_layers",
        "pipeline_parallel_last_stage_less_layers", "pipeline_parallel_layers_per_stage",
        "pipeline_parallel_schedule", "pipeline_parallel_schedule_csv", "pipeline_parallel_microbatch_size",
        "context_parallel_degree", "expert_parallel_degree")},
    "parallelism.enable_async_tensor_parallel": "compile.enable_async_tensor_parallel",
    "compile.enable": "compile.enable",
}
#: fields priced only at their release's default (the value they refuse at -> what is not modelled)
_DEFAULT_ONLY: Mapping[str, tuple[Any, str]] = {
    "parallelism.disable_loss_parallel": (True, "the loss without loss parallelism is not modelled"),
    "parallelism.enable_compiled_autograd": (True, "compiled autograd is not modelled"),
    "fault_tolerance.enable": (True, "torchft's fault-tolerant replicas are not modelled"),
}
#: the Float8 converter's sections: ``[float8]`` (0.1.0, converter ``float8``) and
#: ``[quantize.linear.float8]`` (0.2.x, converter ``quantize.linear.float8``)
_FLOAT8 = {"float8": "float8.", "quantize.linear.float8": "quantize.linear.float8."}
_FLOAT8_FIELDS = ("enable_float8_linear", "enable_fsdp_float8_all_gather", "recipe_name", "filter_fqns", "emulate")
_READ = {"model.name", "model.flavor", "model.converters", "activation_checkpoint.mode",
         "activation_checkpoint.selective_ac_option", "parallelism.module_fqns_per_model_part",
         "parallelism.pipeline_parallel_split_points",
         *(f"{section}{f}" for section in _FLOAT8.values() for f in _FLOAT8_FIELDS)}
_IGNORED_SECTIONS = ("job.", "profiling.", "metrics.", "optimizer.", "lr_scheduler.", "checkpoint.", "comm.",
                     "validation.", "memory_estimation.", "float8.", "quantize.", "mx.", "experimental.",
                     "dataloader.", "fault_tolerance.", "activation_checkpoint.")
_IGNORED = {"model.hf_assets_path", "model.tokenizer_path", "model.print_after_conversion", "training.dataset",
            "training.dataset_path", "training.max_norm", "training.steps", "training.gc_freq", "training.gc_debug",
            "training.seed", "training.deterministic", "compile.components", "compile.backend",
            "parallelism.context_parallel_load_balancer", "parallelism.context_parallel_rotate_method",
            "parallelism.expert_tensor_parallel_degree", "parallelism.expert_parallel_comm_backend",
            "parallelism.pipeline_parallel_expert_parallel_overlap"}

#: what the earlier releases ran that 0.3.0, priced here, does not
LOSS_BEFORE_0_3 = ("the loss of torchtitan before 0.3.0: cross entropy over the whole sequence's logits cast to "
                   "fp32 (torchtitan/components/loss.py), which 0.3.0's chunked loss, priced here, does not keep")


def is_toml(text: str) -> bool:
    """Whether ``text`` is a TOML job file (a table of torchtitan's sections), not arguments."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return False
    return any(isinstance(doc.get(s), dict) for s in ("model", "training", "parallelism", "job"))


def _flat(doc: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``section.field`` -> value of a TOML document (nested tables joined with dots)."""
    out: dict[str, Any] = {}
    for k, v in doc.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def read_toml_job(text: str, gpus: int) -> Job:
    """The job of a TOML job file on ``gpus`` devices (ImportProblemError naming all it cannot price)."""
    fields = _flat(tomllib.loads(text))
    problems: list[str] = []
    values = dict(TRAINER_DEFAULTS)
    values["training.disable_cuda_graphs"] = "true"
    unknown: list[str] = []
    ignored: list[str] = []
    for key, value in fields.items():
        if key in _PRICED:
            values[_PRICED[key]] = _text(value)
        elif key in _DEFAULT_ONLY:
            refused_at, what = _DEFAULT_ONLY[key]
            if value == refused_at:
                problems.append(f"{key} = {_text(value)}: {what}")
            else:
                ignored.append(key)
        elif key in _READ:
            continue
        elif key in _IGNORED or key.startswith(_IGNORED_SECTIONS):
            ignored.append(key)
        else:
            unknown.append(f"{key} = {_text(value)}")
    flavor = _flavor(fields, problems)
    ac, adjusted = _activation_checkpoint(fields, problems)
    float8 = _float8(fields, problems, adjusted)
    parts = _parts(fields, problems)
    if problems:
        raise ImportProblemError(KIND, problems + unmodelled(values))
    assert flavor is not None
    adjusted.insert(0, "a TOML job file of torchtitan before 0.3.0, priced as torchtitan 0.3.0 runs its settings "
                       "(without CUDA graphs, which the earlier releases do not capture)")
    return Job(flavor, values, ac, parts, gpus, None, adjusted, unknown, ignored, [LOSS_BEFORE_0_3], float8)


def _flavor(fields: Mapping[str, Any], problems: list[str]) -> Flavor | None:
    """The llama3 flavor of ``[model]`` (None, with the reason in ``problems``, for another)."""
    name, flavor = fields.get("model.name", "llama3"), fields.get("model.flavor", "debugmodel")
    others = [c for c in _converters(fields) if c not in _FLOAT8]
    if others:
        problems.append(f"model.converters {', '.join(others)}: the converted (low-precision) linear layers are not "
                        "modelled (torchao's Float8 is)")
    if name != "llama3":
        problems.append(f"model.name {name!r}: parplan reads torchtitan's llama3 models only")
        return None
    found = next((f for f in FLAVORS if f.flavor == flavor), None)
    if found is None:
        problems.append(f"model.flavor {flavor!r} is none of the llama3 flavors parplan knows "
                        f"({', '.join(f.flavor for f in FLAVORS)})")
    return found


def _converters(fields: Mapping[str, Any]) -> list[str]:
    value = fields.get("model.converters") or []
    return [c.strip() for c in (value.split(",") if isinstance(value, str) else value) if str(c).strip()]


def _float8(fields: Mapping[str, Any], problems: list[str], adjusted: list[str]) -> str | None:
    """The parplan precision of the job's torchao Float8 linear layers (None without): the converter
    ``float8`` / ``quantize.linear.float8`` (or 0.1.0's earlier ``[float8] enable_float8_linear``) and
    its section (``Float8`` in config_manager.py, v0.1.0; ``Float8Linear`` in job_config.py, v0.2.2;
    applied by ``Float8Converter`` in torchtitan/components/quantization/float8.py)."""
    on = [s for c, s in _FLOAT8.items() if c in _converters(fields)]
    if not on and fields.get("float8.enable_float8_linear") is not True:
        return None
    # the converter's own section first (v0.2.2's 405B file names converter "float8" beside
    # [quantize.linear.float8], the section that release reads)
    sections = list(dict.fromkeys([*on, *_FLOAT8.values()]))
    section = next((s for s in sections if any(k.startswith(s) for k in fields)), sections[0])
    field = {f: next((fields[s + f] for s in sections if s + f in fields), None) for f in _FLOAT8_FIELDS}
    recipe, gather = field["recipe_name"] or "tensorwise", field["enable_fsdp_float8_all_gather"] is True
    name = {"tensorwise": "fp8-torchao-fsdp8" if gather else "fp8-torchao", "rowwise": "fp8-torchao-rowwise"}.get(
        str(recipe))
    if name is None:
        problems.append(f"{section}recipe_name {recipe!r}: its weight-gradient GEMM in bf16 is not modelled "
                        "(tensorwise and rowwise are)")
    if gather and field["recipe_name"] is not None:
        problems.append(f"{section}enable_fsdp_float8_all_gather with recipe_name {recipe!r}: torchtitan refuses it "
                        "(float8 all-gather is the tensorwise recipe's)")
    if field["emulate"] is True:
        problems.append(f"{section}emulate: emulated Float8 GEMMs are not modelled")
    fqns = [str(f) for f in field["filter_fqns"] or []]
    if any(f != "output" for f in fqns):
        problems.append(f"{section}filter_fqns {fqns}: linear layers left in bf16 other than the output are not "
                        "modelled (parplan's Float8 converts every block's linear layers)")
    adjusted.append(f"torchao Float8 linear layers ({recipe}{', FSDP2 float8 all-gather' if gather else ''}): "
                    f"precision {name}" + ("" if "output" in fqns else
                                           "; the output layer, converted too (not in filter_fqns), is priced in "
                                           "bf16 (its GEMM's time above, and with the float8 all-gather its "
                                           "gathered weight)"))
    return name


def _activation_checkpoint(fields: Mapping[str, Any], problems: list[str]) -> tuple[str, list[str]]:
    """(the job's checkpointing as :class:`Job` names it, what was said): ``[activation_checkpoint]``
    ``mode`` and ``selective_ac_option``, defaults ``selective`` and ``"2"`` in 0.1.0 to 0.2.2."""
    adjusted: list[str] = []
    mode = fields.get("activation_checkpoint.mode")
    option = str(fields.get("activation_checkpoint.selective_ac_option", "2"))
    if mode is None:
        mode = "selective"
        adjusted.append("activation_checkpoint.mode not given: the release's default, selective")
    if mode in ("none", "full"):
        return str(mode), adjusted
    if mode != "selective":
        problems.append(f"activation_checkpoint.mode {mode!r} is not modelled (none, full and selective are)")
        return "none", adjusted
    if "activation_checkpoint.selective_ac_option" not in fields:
        adjusted.append("activation_checkpoint.selective_ac_option not given: the release's default, every 2nd layer")
    if option == "op":
        return "selective", adjusted
    if not option.isdigit():
        problems.append(f"activation_checkpoint.selective_ac_option {option!r}: torchtitan takes 'op' or a layer "
                        "interval")
        return "none", adjusted
    if int(option) <= 1:  # torchtitan: `not ac_freq or count % ac_freq == 0` wraps every block
        adjusted.append(f"selective_ac_option {option}: every block checkpointed whole (full)")
        return "full", adjusted
    return option, adjusted


def _parts(fields: Mapping[str, Any], problems: list[str]) -> tuple[str, ...]:
    """Modules per pipeline stage (``module_fqns_per_model_part``), joined with commas."""
    if fields.get("parallelism.pipeline_parallel_split_points"):
        problems.append("parallelism.pipeline_parallel_split_points: split points are not read (give "
                        "module_fqns_per_model_part)")
    parts = fields.get("parallelism.module_fqns_per_model_part") or []
    if not isinstance(parts, list) or not all(isinstance(p, list) for p in parts):
        problems.append("parallelism.module_fqns_per_model_part: expected a list of lists of module names")
        return ()
    return tuple(",".join(str(m) for m in p) for p in parts)

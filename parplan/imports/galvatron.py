"""Galvatron 2.4.0's strategy file (``galvatron_config.json``) and, when given, its launch flags.

The file holds a strategy per block: TP degree (``tp_sizes_enc``), rank order
(``tp_consecutive_flags``), sharded data parallelism or the model's ``default_dp_type``
(``dp_types_enc``: ZeRO-3, else DDP or ZeRO-2), whole-block recomputation (``checkpoint``), and the
pipeline (``pp_deg``, ``pp_division``, ``pipeline_type``, ``chunks``, ``global_bsz``). Each
block's data-parallel degree is its stage's devices over its TP degree. Megatron-style sequence
parallelism, precision and flash attention are launch flags (``--sequence-parallel``,
``--mixed_precision``, ``--reduce_in_fp32``, ``--use-flash-attn``); without the launch text they
are taken as off, bf16 with fp32 reduction, and on, and the import says so. The model comes from
the caller (Galvatron builds it from its own presets and a few size flags; the size flags given
are checked against it). Priced by the whole-plan evaluator as a per-layer plan.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from parplan.imports.common import ImportProblemError, LayerImport, json_object
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.pipeline import blocks_of
from parplan.solver.cost.plan_evaluator import LayerPlan, LayerStrategy
from parplan.solver.models import ModelSource
from parplan.solver.strategy import Schedule

KIND = "galvatron-config"

_SCHEDULES = {"pipedream_flush": Schedule.ONE_F_ONE_B, "gpipe": Schedule.GPIPE}
#: (--mixed_precision, --reduce_in_fp32) -> parplan precision
_PRECISIONS = {("bf16", True): "bf16", ("fp16", True): "fp16", ("fp32", False): "fp32", ("fp32", True): "fp32",
               ("bf16", False): "bf16-grad16", ("fp16", False): "fp16-grad16"}
#: launch flags that take a value and that the import reads or checks
_SIZE_FLAGS = {"--hidden_size": "hidden", "--num_attention_heads": "heads", "--num_hidden_layers": "layers",
               "--vocab_size": "vocab"}


def _ints(cfg: Mapping[str, Any], key: str) -> list[int]:
    text = cfg.get(key)
    if text is None:
        raise ImportProblemError(KIND, [f"missing {key}"])
    try:
        return [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise ImportProblemError(KIND, [f"{key} {text!r} is not a list of integers"]) from None


def _launch_flags(text: str) -> tuple[dict[str, str | bool], list[str]]:
    """The flags after ``train_dist.py`` (or all of them), and the words that are not flags."""
    words = shlex.split(text.replace("\\\n", " "), comments=True)
    at = next((i for i, w in enumerate(words) if w.endswith("train_dist.py")), None)
    words = words[at + 1:] if at is not None else words
    flags: dict[str, str | bool] = {}
    other: list[str] = []
    i = 0
    while i < len(words):
        w = words[i]
        if w.startswith("--"):
            if i + 1 < len(words) and not words[i + 1].startswith("--"):
                flags[w] = words[i + 1]
                i += 2
                continue
            flags[w] = True
        else:
            other.append(w)
        i += 1
    return flags, other


def read_galvatron_config(text: str, model: ModelSource | None, gpus: int | None, seq_len: int | None = None,
                          launch: str | None = None) -> LayerImport:
    """The per-layer plan of a Galvatron strategy file on ``gpus`` devices, for ``model``."""
    try:
        return _read(text, model, gpus, seq_len, launch)
    except (ValueError, TypeError) as e:  # a value of the wrong kind somewhere in the file or the flags
        raise ImportProblemError(KIND, [f"cannot read the strategy: {e}"]) from None


def _positive_int(cfg: Mapping[str, Any], key: str, default: int) -> int:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | str) or int(value) < 1:
        raise ImportProblemError(KIND, [f"{key} must be a positive integer, got {value!r}"])
    return int(value)


#: the strategy file's keys the import reads or checks
_KNOWN_KEYS = frozenset({"pp_deg", "tp_sizes_enc", "tp_consecutive_flags", "dp_types_enc", "use_sp", "checkpoint",
                         "global_bsz", "chunks", "pp_division", "pipeline_type", "default_dp_type", "vtp", "vsp",
                         "embed_sdp"})
#: the launch flags the import reads or checks (the others are model presets, paths, data and optimizer flags)
_READ_FLAGS = frozenset({*_SIZE_FLAGS, "--seq_length", "--mixed_precision", "--reduce_in_fp32", "--sequence-parallel",
                         "--use-flash-attn", "--no_async_grad_reduce", "--global_train_batch_size", "--chunks"})


def _read(text: str, model: ModelSource | None, gpus: int | None, seq_len: int | None,
          launch: str | None) -> LayerImport:
    cfg, model, gpus = _given(text, model, gpus)
    flags, unknown, unpriced = _launch(launch)
    unknown += sorted(k for k in cfg if k not in _KNOWN_KEYS)
    problems = _size_problems(flags, model)
    seq = int(str(flags["--seq_length"])) if isinstance(flags.get("--seq_length"), str) else seq_len
    pp = _positive_int(cfg, "pp_deg", 1)
    tps = _ints(cfg, "tp_sizes_enc")
    n = len(tps)
    order = _ints(cfg, "tp_consecutive_flags") if "tp_consecutive_flags" in cfg else [1] * n
    sdp = _ints(cfg, "dp_types_enc") if "dp_types_enc" in cfg else [0] * n
    ckpt = _ints(cfg, "checkpoint") if "checkpoint" in cfg else [0] * n
    ulysses = _ints(cfg, "use_sp") if "use_sp" in cfg else [0] * n
    division = _ints(cfg, "pp_division") if "pp_division" in cfg else []
    if any(len(x) != n for x in (order, sdp, ckpt, ulysses)):
        problems.append("the per-block lists have different lengths")
    if any(ulysses) or cfg.get("vsp"):
        problems.append("Ulysses sequence parallelism (use_sp, vsp) is not modelled yet")
    blocks = blocks_of(model.build(1, seq))
    if n != len(blocks):
        problems.append(f"{n} block strategies for the {len(blocks)} blocks of {model.name}")
    if gpus % pp:
        problems.append(f"pp_deg {pp} does not divide {gpus} GPUs")
    if division and (len(division) != pp or sum(division) != n):
        problems.append(f"pp_division {division} is not {pp} stages of the {n} blocks")
    default = str(cfg.get("default_dp_type", "ddp"))
    if default not in ("ddp", "zero2"):
        problems.append(f"default_dp_type {default}")
    schedule = _SCHEDULES.get(str(cfg.get("pipeline_type", "pipedream_flush")))
    if schedule is None:
        problems.append(f"pipeline_type {cfg.get('pipeline_type')}")
    mixed = str(flags.get("--mixed_precision", "bf16"))
    precision = _PRECISIONS.get((mixed, launch is None or "--reduce_in_fp32" in flags))
    if precision is None:
        problems.append(f"--mixed_precision {mixed}")
    per_stage = gpus // pp if pp and gpus % pp == 0 else 0
    if any(per_stage % t for t in tps) or any(t < 1 for t in tps):
        problems.append(f"a TP degree in tp_sizes_enc does not divide the {per_stage} devices of a stage")
    if problems:
        raise ImportProblemError(KIND, problems)
    assert schedule is not None and precision is not None
    sp = bool(flags.get("--sequence-parallel"))
    layers = {}
    for b, t, o, s, c in zip(blocks, tps, order, sdp, ckpt, strict=True):
        dp = per_stage // t
        zero = (3 if s else (2 if default == "zero2" else 0)) if dp > 1 else 0
        layers[b] = LayerStrategy(tp=t, dp=dp, zero=zero, sp=sp and t > 1,
                                  recompute=Recompute.FULL if c else Recompute.NONE, tp_inner=bool(o))
    gb, m = _batch(cfg, flags)
    plan = LayerPlan(pp=pp, num_microbatches=m, global_batch=gb, layers=layers,
                     partition=tuple(division) if division else None, schedule=schedule,
                     flash_attention="--use-flash-attn" in flags or launch is None, precision=precision,
                     sync_every_microbatch="--no_async_grad_reduce" in flags)
    for strategy in layers.values():
        plan.local_batch(strategy)  # StrategyError when the batch does not split
    ignored = [f for f in flags if f not in _READ_FLAGS]
    return LayerImport(KIND, model, plan, seq, gpus, None, "galvatron", unknown, ignored, unpriced)


def _given(text: str, model: ModelSource | None, gpus: int | None) -> tuple[Mapping[str, Any], ModelSource, int]:
    """The strategy file's object, the model and the GPU count (the caller gives the last two)."""
    problems: list[str] = []
    if model is None or model.config is None:
        problems.append("the model: give --model (a preset or a Hugging Face config.json; the strategy file "
                        "does not describe it)")
    if gpus is None:
        problems.append("the GPU count: give --gpus")
    cfg = json_object(KIND, text)
    if problems:
        raise ImportProblemError(KIND, problems)
    assert model is not None and model.config is not None and gpus is not None
    return cfg, model, gpus


def _launch(launch: str | None) -> tuple[dict[str, str | bool], list[str], list[str]]:
    """(launch flags, words that are not flags, what is not priced as written) of the launch text."""
    if launch is None:
        return {}, [], ["no launch flags given: sequence parallelism taken as off, bf16 with fp32 gradient "
                        "reduction, flash attention on"]
    flags, other = _launch_flags(launch)
    return flags, [w for w in other if not w.startswith("$")], []


def _size_problems(flags: Mapping[str, str | bool], model: ModelSource) -> list[str]:
    """The size flags given that the model does not have."""
    arch = model.config
    assert arch is not None
    return [f"{flag} {flags[flag]} but {model.name} has {field} {getattr(arch, field)}"
            for flag, field in _SIZE_FLAGS.items()
            if flag in flags and str(flags[flag]) != str(getattr(arch, field))]


def _batch(cfg: Mapping[str, Any], flags: Mapping[str, str | bool]) -> tuple[int, int]:
    """(global batch, micro-batches) of the strategy file; the launch flags, when given, must agree."""
    gb, m = _positive_int(cfg, "global_bsz", 0), _positive_int(cfg, "chunks", 1)
    for flag, value in (("--global_train_batch_size", gb), ("--chunks", m)):
        if isinstance(flags.get(flag), str) and str(flags[flag]) != str(value):
            raise ImportProblemError(KIND, [f"{flag} {flags[flag]} but the strategy file says {value}"])
    return gb, m

"""nanotron's YAML configuration (``nanotron.config.Config``, the file ``run_train.py --config-file``
reads), priced with the runtime ``nanotron``.

The schema is nanotron's as the Ultra-Scale Playbook's benchmarks ran it (docs/nanotron.md pins the
commit). nanotron loads the file with dacite in strict mode, so a key it does not know is refused there,
and here too; so are the sizes its own checks refuse (``Config.__post_init__``: heads divisible by
tp and by the key-value heads, key-value heads at least tp) and degrees that are not the GPUs. The
model is a Llama (``model.model_config``); the vocabulary is padded as nanotron pads it (to a multiple
of ``make_vocab_size_divisible_by x tp``); its pipeline ranks hold the layers nanotron gives them
(:func:`~parplan.solver.cost.nanotron.nanotron_partition`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from parplan.imports.common import Imported, ImportProblemError, refusals_as_problems
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.nanotron import nanotron_partition
from parplan.solver.cost.runtime import Runtime
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.models import ModelSource
from parplan.solver.strategy import ParallelConfig, Schedule

KIND = "nanotron-config"

#: Every key of the sections parplan reads, as nanotron's dataclasses name them (a key outside these is
#: refused, as nanotron's strict loader refuses it).
SCHEMA: Mapping[str, frozenset[str]] = {
    "parallelism": frozenset({"dp", "pp", "tp", "pp_engine", "tp_mode", "tp_linear_async_communication",
                              "recompute_layer", "tp_recompute_allgather", "expert_parallel_size"}),
    "model": frozenset({"model_config", "init_method", "dtype", "make_vocab_size_divisible_by",
                        "ddp_bucket_cap_mb"}),
    "model_config": frozenset({"bos_token_id", "eos_token_id", "hidden_act", "hidden_size", "initializer_range",
                               "intermediate_size", "is_llama_config", "max_position_embeddings",
                               "num_attention_heads", "num_hidden_layers", "num_key_value_heads", "pad_token_id",
                               "pretraining_tp", "rms_norm_eps", "rope_scaling", "rope_theta", "rope_interleaved",
                               "tie_word_embeddings", "use_cache", "vocab_size"}),
    "tokens": frozenset({"sequence_length", "train_steps", "micro_batch_size", "batch_accumulation_per_replica",
                         "val_check_interval", "limit_val_batches", "limit_test_batches"}),
    "optimizer": frozenset({"optimizer_factory", "zero_stage", "weight_decay", "clip_grad", "accumulate_grad_in_fp32",
                            "learning_rate_scheduler", "weight_decay_exclude_named_params"}),
}
#: Top-level sections that do not change memory or time as parplan prices them.
IGNORED_SECTIONS = frozenset({"general", "checkpoints", "data_stages", "logging", "profiler", "tokenizer",
                              "lighteval", "s3_upload"})
#: ``model.dtype`` -> parplan's precision (with ``accumulate_grad_in_fp32``).
DTYPES = {"bfloat16": "bf16", "float16": "fp16"}
#: ``parallelism.pp_engine`` -> the schedule it runs.
ENGINES = {"1f1b": Schedule.ONE_F_ONE_B, "afab": Schedule.GPIPE}


def parse_yaml(text: str) -> Mapping[str, Any]:
    """The mapping a YAML file holds (ImportProblemError when it is not one)."""
    import yaml

    try:
        cfg = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ImportProblemError(KIND, [f"not YAML{where}: {getattr(e, 'problem', None) or e}"]) from None
    if not isinstance(cfg, Mapping):
        raise ImportProblemError(KIND, ["expected a YAML mapping (nanotron's Config)"])
    return cfg


def read_nanotron_config(text: str, gpus: int | None = None) -> Imported:
    """The model, strategy and batch of a nanotron YAML config (``gpus``: the GPUs it runs on, which
    must be ``dp x tp x pp``; without it, that product)."""
    return imported_of(parse_yaml(text), gpus)


def imported_of(cfg: Mapping[str, Any], gpus: int | None = None) -> Imported:
    """:func:`read_nanotron_config` of a config already parsed."""
    ignored = sorted(k for k in cfg if k in IGNORED_SECTIONS)
    problems = [f"unknown section {k!r} (nanotron's Config has no such field)"
                for k in cfg if k not in SCHEMA and k not in IGNORED_SECTIONS]
    sections = {name: _section(cfg, name, problems) for name in ("parallelism", "model", "tokens", "optimizer")}
    sections["model_config"] = _section(sections["model"], "model_config", problems, "model.")
    for name, keys in SCHEMA.items():
        prefix = "model." if name == "model_config" else ""
        problems += [f"unknown option {prefix}{name}.{k} (nanotron's loader refuses it)"
                     for k in sections[name] if k not in keys]
    if problems:
        raise ImportProblemError(KIND, problems)
    par, model, tokens, opt, arch = (sections[k] for k in ("parallelism", "model", "tokens", "optimizer",
                                                          "model_config"))
    tp, pp, dp = (_int(par, k, "parallelism") for k in ("tp", "pp", "dp"))
    if gpus is not None and tp * pp * dp != gpus:
        raise ImportProblemError(KIND, [f"dp x tp x pp = {dp} x {tp} x {pp} = {dp * tp * pp} is not the {gpus} GPUs"])
    config = _model(arch, model, tp, _int(tokens, "sequence_length", "tokens"))
    strategy = _strategy(par, model, tokens, opt, config, (tp, pp, dp))
    unpriced = ["the updated weights' all-gather under ZeRO-1 and DDP's bucket rebuild in the second step "
                "(each below the end of a backward)"]
    return Imported(KIND, ModelSource(config.name, config=config), strategy, config.seq_len, tp * pp * dp, None,
                    "nanotron", [], ignored, unpriced)


def _section(parent: Mapping[str, Any], name: str, problems: list[str], prefix: str = "") -> Mapping[str, Any]:
    value = parent.get(name)
    if not isinstance(value, Mapping):
        problems.append(f"missing section {prefix}{name}" if value is None else f"{prefix}{name} is not a mapping")
        return {}
    return value


def _int(section: Mapping[str, Any], key: str, where: str, default: int | None = None, low: int = 1) -> int:
    value = section.get(key, default)
    if value is None:
        raise ImportProblemError(KIND, [f"missing {where}.{key}"])
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ImportProblemError(KIND, [f"{where}.{key} {value!r} is not an integer of at least {low}"])
    return value


def _model(arch: Mapping[str, Any], model: Mapping[str, Any], tp: int, seq: int) -> TransformerConfig:
    """The Llama of ``model.model_config``, its vocabulary padded as nanotron pads it, checked as
    nanotron's ``Config.__post_init__`` checks it."""
    where = "model.model_config"
    hidden, heads = _int(arch, "hidden_size", where, 4096), _int(arch, "num_attention_heads", where, 32)
    kv = _int(arch, "num_key_value_heads", where, heads)
    problems = []
    if hidden % heads:
        problems.append(f"hidden_size {hidden} is not divisible by num_attention_heads {heads}")
    if heads % tp:
        problems.append(f"num_attention_heads {heads} is not divisible by tp {tp}")
    if heads % kv:
        problems.append(f"num_attention_heads {heads} is not divisible by num_key_value_heads {kv}")
    if kv < tp:
        problems.append(f"num_key_value_heads {kv} is below tp {tp} (nanotron does not repeat them)")
    if arch.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act {arch['hidden_act']!r}: nanotron's Llama is SwiGLU (silu)")
    if arch.get("is_llama_config", True) is not True:
        problems.append("model_config is not a Llama (is_llama_config)")
    if problems:
        raise ImportProblemError(KIND, problems)
    multiple = _int(model, "make_vocab_size_divisible_by", "model", 1) * tp
    vocab = -(-_int(arch, "vocab_size", where, 32000) // multiple) * multiple  # helpers._vocab_size_with_padding
    layers, ffn = _int(arch, "num_hidden_layers", where, 32), _int(arch, "intermediate_size", where, 11008)
    tied = bool(arch.get("tie_word_embeddings", False))
    name = f"nanotron-llama-{layers}x{hidden}"
    return TransformerConfig(family="llama", name=name, layers=layers, hidden=hidden, heads=heads, kv_heads=kv,
                             ffn=ffn, vocab=vocab, seq_len=seq, tied_embeddings=tied)


def _strategy(par: Mapping[str, Any], model: Mapping[str, Any], tokens: Mapping[str, Any], opt: Mapping[str, Any],
              config: TransformerConfig, degrees: tuple[int, int, int]) -> ParallelConfig:
    tp, pp, dp = degrees
    problems = []
    engine = str(par.get("pp_engine") or "afab")  # nanotron's default engine
    mode = str(par.get("tp_mode") or "ALL_REDUCE").upper()
    zero = _int(opt, "zero_stage", "optimizer", low=0)
    dtype = str(model.get("dtype") or "bfloat16")
    if engine not in ENGINES:
        problems.append(f"parallelism.pp_engine {engine!r} (nanotron has {', '.join(ENGINES)})")
    if mode not in ("ALL_REDUCE", "REDUCE_SCATTER"):
        problems.append(f"parallelism.tp_mode {mode!r} (nanotron has ALL_REDUCE, REDUCE_SCATTER)")
    if zero > 1:
        problems.append(f"optimizer.zero_stage {zero} (nanotron has 0 and 1)")
    if dtype not in DTYPES:
        problems.append(f"model.dtype {dtype!r}: parplan prices {', '.join(DTYPES)}")
    if opt.get("accumulate_grad_in_fp32") is not True:
        problems.append("optimizer.accumulate_grad_in_fp32 false (half-precision weights updated in place) "
                        "is not modelled")
    factory = opt.get("optimizer_factory")
    if not isinstance(factory, Mapping) or factory.get("name", "adamW") != "adamW":
        problems.append("an optimizer other than adamW (optimizer.optimizer_factory.name)")
    if par.get("tp_recompute_allgather", True) is not True:
        problems.append("parallelism.tp_recompute_allgather false (the gathered input kept) is not modelled")
    if _int(par, "expert_parallel_size", "parallelism", 1) > 1:
        problems.append("parallelism.expert_parallel_size above 1 for a dense Llama")
    mb = _int(tokens, "micro_batch_size", "tokens")
    m = _int(tokens, "batch_accumulation_per_replica", "tokens")
    if pp > 1 and engine == "1f1b" and m < pp - 1:
        problems.append(f"1f1b needs at least pp - 1 = {pp - 1} micro-batches, "
                        f"batch_accumulation_per_replica is {m}")
    partition = nanotron_partition(config.layers, config.hidden, config.heads, config.ffn, config.vocab, pp)
    if 0 in partition:
        problems.append(f"nanotron places the layers {list(partition)} on the pipeline ranks: a rank without a "
                        "decoder layer is not modelled")
    if problems:
        raise ImportProblemError(KIND, problems)
    with refusals_as_problems(KIND):
        return ParallelConfig(
            tp=tp, pp=pp, dp=dp, zero=zero, sequence_parallel=tp > 1 and mode == "REDUCE_SCATTER",
            recompute=Recompute.FULL if par.get("recompute_layer") else Recompute.NONE, micro_batch=mb,
            num_microbatches=m, schedule=ENGINES[engine] if pp > 1 else Schedule.ONE_F_ONE_B,
            precision=DTYPES[dtype], partition=partition if pp > 1 else None, runtime=Runtime.NANOTRON)


__all__ = ["KIND", "SCHEMA", "imported_of", "parse_yaml", "read_nanotron_config"]

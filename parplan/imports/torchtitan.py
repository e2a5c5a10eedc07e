"""torchtitan jobs, read as torchtitan 0.3.0 runs them: its command line (``torchtitan_args.txt`` as
``parplan export`` writes it, one token a line, or a ``torchrun ... -m torchtitan.train ...`` line), or
a TOML job file of the releases before it (:mod:`.torchtitan_toml`).

A command line picks a recipe with ``--module``/``--config`` (:data:`~.torchtitan_recipes.RECIPES`),
whose fields stand where the line does not change them, over the trainer's own defaults
(:data:`~.torchtitan_recipes.TRAINER_DEFAULTS`). The model is the recipe's llama3 flavor (sizes in
:data:`parplan.exports.torchtitan.FLAVORS`), matched to the parplan preset of the same sizes.
Degrees, batch, pipeline stages and FSDP resharding are resolved as the trainer resolves them, and
each value it chose is said in ``adjusted``. Activation checkpointing: ``full`` is parplan's full
recomputation; ``none`` parplan's selective one (with flash attention they keep the same tensors);
torchtitan's per-operator ``selective`` policy parplan's per-operator recomputation (``op``); a TOML
file's layer interval is a per-layer plan.
Priced with the buffers of torchtitan's runtime.
"""

from __future__ import annotations

import itertools
import shlex
from collections.abc import Mapping
from dataclasses import replace

from parplan.exports.torchtitan import FLAVORS, SCHEDULES, Flavor
from parplan.imports.common import Imported, ImportProblemError, LayerImport, refusals_as_problems, world_size
from parplan.imports.torchtitan_job import KIND, Job, unmodelled
from parplan.imports.torchtitan_recipes import (
    RECIPES,
    SWITCHES,
    TRAINER_DEFAULTS,
    default_stage_layers,
    recipe_of,
    stages_per_rank,
)
from parplan.imports.torchtitan_toml import is_toml, read_toml_job
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.runtime import Runtime
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.frontends.presets import PRESETS
from parplan.solver.models import ModelSource
from parplan.solver.strategy import ParallelConfig, Schedule

#: sections and fields that do not change memory or time as parplan prices them
_IGNORED_SECTIONS = ("job.", "metrics.", "checkpoint.", "optimizer.", "lr_scheduler.", "dataloader.", "comm.",
                     "validation.", "validator.", "profiling.", "profiler.", "debug.", "fault_tolerance.",
                     "tokenizer.", "activation_checkpoint.")
_IGNORED = {"training.steps", "training.dataset", "training.dataset_path", "training.max_norm", "training.seed",
            "training.deterministic", "training.gc_freq", "training.gc_debug", "hf_assets_path", "dump_folder",
            "compile.components", "compile.backend", "parallelism.context_parallel_load_balancer",
            "parallelism.context_parallel_ptrr_mask_key"}
#: activation_checkpoint subcommands of torchtitan 0.3.0 (``distributed/activation_checkpoint.py``)
_AC_MODES = ("selective", "full", "none", "memory-budget")


def _key(flag: str) -> str:
    return flag[2:].replace("-", "_")


def split_launch(text: str) -> tuple[list[str], list[str]]:
    """(launcher words, ``torchtitan.train``'s arguments) of an argument file (one a line) or of a
    ``torchrun ... -m torchtitan.train ...`` line (no launcher words without one)."""
    try:
        words = shlex.split(text.replace("\\\n", " "), comments=True)
    except ValueError as e:
        raise ImportProblemError(KIND, [f"cannot split the arguments: {e}"]) from None
    if "torchtitan.train" not in words:
        return [], words
    at = words.index("torchtitan.train")
    return words[:at], words[at + 1:]


def read_torchtitan_config(text: str, gpus: int | None = None) -> Imported | LayerImport:
    """The model, strategy and batch of a torchtitan job on ``gpus`` devices (from a torchrun line
    when it says): torchtitan 0.3.0 arguments, or a TOML job file of an earlier release."""
    if is_toml(text):
        if gpus is None:
            raise ImportProblemError(KIND, ["a TOML job file does not say the GPU count: give --gpus"])
        return price_job(read_toml_job(text, gpus))
    return read_torchtitan_args(text, gpus)


def read_torchtitan_args(text: str, gpus: int | None = None) -> Imported:
    """The model, strategy and batch of torchtitan 0.3.0 arguments (uniform: 0.3.0 has no layer interval)."""
    imported = price_job(_line_job(text, gpus))
    assert isinstance(imported, Imported)
    return imported


def _launcher(launcher: list[str]) -> tuple[int | None, int | None]:
    """(nodes, processes per node) of torchrun's options."""
    nodes = procs = None
    pairs = [tuple(w.split("=", 1)) for w in launcher if "=" in w] + list(itertools.pairwise(launcher))
    for name, given in pairs:
        if name == "--nnodes" and given.isdigit():
            nodes = int(given)
        if name in ("--nproc-per-node", "--nproc_per_node") and given.isdigit():
            procs = int(given)
    return nodes, procs


def _world(line: int | None, gpus: int | None, adjusted: list[str]) -> int:
    """The GPU count: ``gpus`` when given (said when the launch line starts another count), else the
    launch line's (``line``)."""
    if gpus is not None and line is not None and gpus != line:
        adjusted.append(f"--gpus {gpus} in place of the {line} processes of the launch line")
    return world_size(KIND, None, None, gpus if gpus is not None else line)


#: ``run_train.sh``'s variables and their defaults (torchtitan's launcher script: ``NGPU=${NGPU:-"8"}``,
#: ``MODULE=${MODULE:-"llama3"}``, ``CONFIG=${CONFIG:-"llama3_debugmodel"}``; one node)
RUN_TRAIN_DEFAULTS = {"NGPU": "8", "MODULE": "llama3", "CONFIG": "llama3_debugmodel"}


def _run_train(words: list[str], adjusted: list[str]) -> tuple[list[str], int, int | None, list[str]]:
    """(torchtitan's arguments, GPUs, GPUs per node, ignored variables) of ``[VAR=value ...]
    ./run_train.sh [args]``: the script passes ``--module $MODULE --config $CONFIG`` and its arguments
    to ``torchrun --nproc_per_node=$NGPU`` (one process standing in for all with ``COMM_MODE``)."""
    at = next(i for i, w in enumerate(words) if w.endswith("run_train.sh"))
    env = dict(w.split("=", 1) for w in words[:at] if "=" in w)
    used = {k: env.get(k, v) for k, v in RUN_TRAIN_DEFAULTS.items()}
    said = [f"{k} {v} (its default)" for k, v in used.items() if k not in env]
    if said:
        adjusted.append("run_train.sh without " + ", ".join(said))
    if not used["NGPU"].isdigit():
        raise ImportProblemError(KIND, [f"NGPU={used['NGPU']!r} is not a GPU count"])
    if env.get("COMM_MODE"):
        adjusted.append(f"COMM_MODE {env['COMM_MODE']}: run_train.sh runs one process standing in for NGPU "
                        f"{used['NGPU']} ranks (--comm.mode); priced as {used['NGPU']} GPUs")
    args = ["--module", used["MODULE"], "--config", used["CONFIG"], *words[at + 1:]]
    gpus = int(used["NGPU"])
    return args, gpus, None if env.get("COMM_MODE") else gpus, [k for k in env if k not in RUN_TRAIN_DEFAULTS]


def _line_job(text: str, gpus: int | None) -> Job:
    """The job of torchtitan 0.3.0 arguments: the recipe's fields under the line's."""
    launcher, words = split_launch(text)
    nodes, procs = _launcher(launcher)
    adjusted: list[str] = []
    env_ignored: list[str] = []
    if launcher and procs and nodes is None:
        nodes = 1
        adjusted.append("torchrun without --nnodes: one node (torchrun's default)")
    line_gpus = nodes * procs if nodes and procs else None
    if not launcher and any(w.endswith("run_train.sh") for w in words):
        words, line_gpus, procs, env_ignored = _run_train(words, adjusted)
    line, parts, ac, unknown, ignored = _parse_words(words)
    variables = [f"--{k} {v}" for k, v in line.items() if v.startswith("$")]
    if variables:
        raise ImportProblemError(KIND, [f"{', '.join(variables)}: a shell variable parplan does not expand "
                                        "(write its value)"])
    module, config = line.pop("module", None), line.pop("config", None)
    if module is None or config is None:
        raise ImportProblemError(KIND, ["torchtitan 0.3.0 needs --module and --config (e.g. --module llama3 --config "
                                        "llama3_8b); a TOML job file of an earlier release is read as one"])
    recipe = recipe_of(module, config)
    if recipe is None:
        known = ", ".join(r.config for r in RECIPES if r.module == "llama3")
        raise ImportProblemError(KIND, [f"--module {module} --config {config} is no recipe parplan knows (torchtitan "
                                        f"0.3.0's llama3 module: {known})"])
    if recipe.refused:
        raise ImportProblemError(KIND, [f"--config {config}: {recipe.refused}"])
    flavor = next(f for f in FLAVORS if f.flavor == recipe.flavor)
    kept = {k: v for k, v in recipe.fields.items() if k not in line}
    if ac is None:
        kept["activation_checkpoint"] = recipe.ac
    if kept:
        adjusted.append(f"the {config} recipe sets " + ", ".join(f"{k} {v}" for k, v in kept.items())
                        + f" ({recipe.source.split(':')[0]})")
    values = {**TRAINER_DEFAULTS, **recipe.fields, **line}
    world = _world(line_gpus, gpus, adjusted)
    unpriced = [] if values["training.disable_cuda_graphs"] == "true" else [
        "CUDA graphs (torchtitan's default without --training.disable_cuda_graphs) keep memory pools the "
        "prediction leaves out"]
    if recipe.float8 is not None:
        adjusted.append(f"the {config} recipe's Float8 linear layers (torchao, rowwise): precision {recipe.float8}"
                        + ("" if recipe.module != "llama3" or recipe.flavor != "debugmodel" else
                           "; its output layer, converted too (no filter_fqns), is priced in bf16"))
    return Job(flavor, values, ac or recipe.ac, tuple(parts), world, procs, adjusted, unknown,
               ignored + env_ignored, unpriced, recipe.float8)


def _parse_words(words: list[str]) -> tuple[dict[str, str], list[str], str | None, list[str], list[str]]:
    """(fields the line sets, modules per stage, the activation_checkpoint subcommand, unknown, ignored)."""
    line: dict[str, str] = {}
    parts: list[str] = []
    ac: str | None = None
    unknown: list[str] = []
    ignored: list[str] = []
    i = 0
    while i < len(words):
        w = words[i]
        i += 1
        if w.startswith("activation_checkpoint:"):
            ac = w.split(":", 1)[1]
            if ac not in _AC_MODES:
                raise ImportProblemError(KIND, [f"{w}: torchtitan 0.3.0's are " +
                                                ", ".join(f"activation_checkpoint:{m}" for m in _AC_MODES)])
            continue
        if w.startswith("$") or not w.startswith("--"):
            (ignored if w.startswith("$") else unknown).append(w)
            continue
        name, eq, inline = w.partition("=")
        key = _key(name)
        if key == "parallelism.module_fqns_per_model_part":
            while i < len(words) and not words[i].startswith("--") and ":" not in words[i]:
                parts.append(words[i])
                i += 1
            continue
        section, _, fname = key.rpartition(".")
        if key in SWITCHES or (fname.startswith("no_") and f"{section}.{fname[3:]}" in SWITCHES):
            on = key in SWITCHES
            line[key if on else f"{section}.{fname[3:]}"] = "true" if on else "false"
            continue
        value: str | None = inline if eq else None
        if value is None and i < len(words) and not words[i].startswith("--") and ":" not in words[i]:
            value = words[i]
            i += 1
        if key in TRAINER_DEFAULTS or key in ("module", "config"):
            if value is None:
                raise ImportProblemError(KIND, [f"{name} needs a value"])
            line[key] = value
        elif key in _IGNORED or key.startswith(_IGNORED_SECTIONS):
            ignored.append(name)
        else:
            unknown.append(name if value is None else f"{name} {value}")
    return line, parts, ac, unknown, ignored


def _num(values: Mapping[str, str], key: str) -> int:
    text = values[key]
    if not text.isdigit() or int(text) < 1:
        raise ImportProblemError(KIND, [f"{key} {text!r} is not a positive integer"])
    return int(text)


def price_job(job: Job) -> Imported | LayerImport:
    """The job priced as torchtitan 0.3.0 runs it (ImportProblemError naming all it cannot price)."""
    values, adjusted = job.values, list(job.adjusted)
    problems = unmodelled(values)
    replicate, shard, tp, pp = _degrees(values, job.world, problems, adjusted)
    zero = _zero(values, shard, pp, problems, adjusted)
    recompute, approximated = _recompute(job.ac, problems)
    precision = {"bfloat16": "bf16", "float32": "fp32"}.get(values["training.mixed_precision_param"])
    if precision is None:
        problems.append(f"training.mixed_precision_param {values['training.mixed_precision_param']}")
    elif job.float8 is not None:
        if precision != "bf16":
            problems.append(f"Float8 linear layers with training.mixed_precision_param "
                            f"{values['training.mixed_precision_param']}: parplan prices torchao's Float8 beside bf16")
        precision = job.float8
        if precision == "fp8-torchao-fsdp8" and shard == 1:  # float8.py: parallel_dims.dp_shard_enabled and ...
            precision = "fp8-torchao"
            adjusted.append("enable_fsdp_float8_all_gather without FSDP sharding (data_parallel_shard_degree 1): "
                            "torchtitan leaves it off, precision fp8-torchao")
    schedule = _schedule(values, pp, problems)
    if pp > 1 and values["training.disable_cuda_graphs"] != "true":
        problems.append("pipeline parallelism with CUDA graphs: torchtitan 0.3.0 stops ('CUDA graphs do not support "
                        "pipeline parallelism yet'); set --training.disable_cuda_graphs")
    if problems:
        raise ImportProblemError(KIND, problems)
    assert precision is not None
    dp = replicate * shard
    seq, mb, m = _batch(values, pp, dp, adjusted)
    virtual, partition = _stages(job, values, pp, schedule, adjusted)
    sp = tp > 1 and values["parallelism.enable_sequence_parallel"] == "true"
    with refusals_as_problems(KIND):
        strategy = ParallelConfig(
            tp=tp, pp=pp, dp=dp, zero=zero, sequence_parallel=sp, recompute=recompute, micro_batch=mb,
            num_microbatches=m, schedule=schedule if pp > 1 else Schedule.ONE_F_ONE_B, virtual_stages=virtual,
            precision=precision, partition=partition, runtime=Runtime.TORCHTITAN,
            dp_shard=shard if replicate > 1 and shard > 1 else 0)
    preset = _preset_of(job.flavor)
    model = ModelSource(preset, config=PRESETS[preset]) if preset else _flavor_model(job.flavor, seq)
    if job.ac.isdigit():
        return _interval_import(job, model, strategy, seq, adjusted)
    return Imported(KIND, model, strategy, seq, job.world, job.per_node, "torchtitan", job.unknown, job.ignored,
                    job.unpriced, adjusted=adjusted + approximated)


def _recompute(ac: str, problems: list[str]) -> tuple[Recompute, list[str]]:
    """parplan's recomputation for torchtitan's activation checkpointing, and what it approximates."""
    if ac == "full":
        return Recompute.FULL, []
    if ac == "none" or ac.isdigit():  # a layer interval: the blocks it leaves run without checkpointing
        return Recompute.SELECTIVE, []
    if ac == "selective":  # SelectiveAC, the per-operator policy (TOML: selective_ac_option "op")
        return Recompute.OP, []
    problems.append(f"activation checkpointing {ac!r} is not modelled (full, none and torchtitan's selective are)")
    return Recompute.SELECTIVE, []


def _interval_import(job: Job, model: ModelSource, strategy: ParallelConfig, seq: int,
                     adjusted: list[str]) -> LayerImport:
    """A layer interval ``N`` (TOML ``selective_ac_option``): every N-th block of each rank's blocks,
    counted from 1 in order, checkpointed whole, the others not (torchtitan's ``_apply_layer_sac``
    before 0.3.0 counts the blocks it wraps in a process)."""
    from parplan.solver.cost.pipeline import blocks_of, stage_of_units
    from parplan.solver.cost.plan_memory import layer_plan

    every = int(job.ac)
    if every < 1:
        raise ImportProblemError(KIND, [f"selective_ac_option {job.ac!r}: a layer interval is a positive integer"])
    graph = model.build(1, seq)
    plan = layer_plan(graph, strategy)
    stages = stage_of_units(graph, strategy.pp * strategy.virtual_stages, strategy.partition)
    counts: dict[int, int] = {}
    layers = {}
    for block in blocks_of(graph):
        rank = stages[block] % strategy.pp
        counts[rank] = counts.get(rank, 0) + 1
        full = counts[rank] % every == 0
        layers[block] = replace(plan.layers[block], recompute=Recompute.FULL if full else Recompute.SELECTIVE)
    adjusted.append(f"selective_ac_option {every}: every {every}{_ordinal(every)} block of each rank (counted from "
                    "1) checkpointed whole, the others not")
    return LayerImport(KIND, model, replace(plan, layers=layers), seq, job.world, job.per_node, "torchtitan",
                       job.unknown, job.ignored, job.unpriced, adjusted=adjusted)


def _ordinal(n: int) -> str:
    return "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")


def _preset_of(flavor: Flavor) -> str | None:
    """The parplan preset with the flavor's sizes (an untied Llama), if one has them."""
    sizes = flavor.sizes()
    return next((name for name, c in PRESETS.items() if c.family == "llama" and not c.tied_embeddings
                 and {"layers": c.layers, "hidden": c.hidden, "heads": c.heads, "kv_heads": c.n_kv_heads,
                      "ffn": c.ffn, "vocab": c.vocab, "head_dim": c.d_head} == sizes), None)


def _degrees(values: Mapping[str, str], world: int, problems: list[str],
             adjusted: list[str]) -> tuple[int, int, int, int]:
    """(replicate, shard, tp, pp) on ``world`` GPUs (shard -1: the GPUs the others leave)."""
    replicate = _num(values, "parallelism.data_parallel_replicate_degree")
    tp = _num(values, "parallelism.tensor_parallel_degree")
    pp = _num(values, "parallelism.pipeline_parallel_degree")
    if world % (tp * pp * replicate):
        raise ImportProblemError(KIND, [f"tp {tp} x pp {pp} x replicate {replicate} = {tp * pp * replicate} does not "
                                        f"divide {world} GPUs"])
    if values["parallelism.data_parallel_shard_degree"] == "-1":
        shard = world // (tp * pp * replicate)
        adjusted.append(f"data_parallel_shard_degree -1: the {shard} rank(s) tp x pp x replicate leave of {world}")
    else:
        shard = _num(values, "parallelism.data_parallel_shard_degree")
    if tp * pp * replicate * shard != world:
        problems.append(f"tp {tp} x pp {pp} x replicate {replicate} x shard {shard} is not the {world} GPUs")
    if replicate > 1 and shard > 1:
        adjusted.append(f"HSDP: FSDP2 over shard groups of {shard} ranks, replicated {replicate} times (dp_shard "
                        f"{shard} of dp {replicate * shard})")
    return replicate, shard, tp, pp


def _zero(values: Mapping[str, str], shard: int, pp: int, problems: list[str], adjusted: list[str]) -> int:
    """FSDP2's resharding as parplan's ZeRO stage (0 without sharding)."""
    reshard = values["parallelism.fsdp_reshard_after_forward"]
    if reshard not in ("default", "always", "never"):
        problems.append(f"parallelism.fsdp_reshard_after_forward {reshard}")
    if shard == 1:
        return 0
    if reshard == "default":
        adjusted.append("fsdp_reshard_after_forward default: " + (
            "weights resharded after forward (ZeRO-3)" if pp == 1 else
            "with pipelining, weights kept gathered from forward to backward (ZeRO-2)"))
    return 3 if reshard == "always" or (reshard == "default" and pp == 1) else 2


def _schedule(values: Mapping[str, str], pp: int, problems: list[str]) -> Schedule:
    name = values["parallelism.pipeline_parallel_schedule"]
    schedule = {v: Schedule(k) for k, v in SCHEDULES.items()}.get(name)
    if pp > 1 and schedule is None:
        problems.append(f"pipeline schedule {name} is not modelled ({', '.join(SCHEDULES.values())} are)")
    return schedule or Schedule.ONE_F_ONE_B


def _batch(values: Mapping[str, str], pp: int, dp: int, adjusted: list[str]) -> tuple[int, int, int]:
    """(sequence length, micro-batch, micro-batches per step): with pipelining the local batch is split
    into micro-batches; without, torchtitan accumulates ``global / (local x dp)`` passes."""
    seq = _num(values, "training.seq_len")
    local = _num(values, "training.local_batch_size")
    if values["training.global_batch_size"] == "-1":
        gb = local * dp
        adjusted.append(f"global_batch_size -1: local {local} x dp {dp} = {gb}")
    else:
        gb = _num(values, "training.global_batch_size")
    if pp > 1:
        mb = _num(values, "parallelism.pipeline_parallel_microbatch_size")
        if local % mb or gb != local * dp:
            raise ImportProblemError(KIND, [f"with pipelining the local batch {local} must be micro-batches of {mb} "
                                            f"and the global batch {gb} = local x dp {dp} (gradient accumulation over "
                                            "pipeline runs is not modelled)"])
        return seq, mb, local // mb
    if gb % (local * dp):
        raise ImportProblemError(KIND, [f"global batch {gb} is not a multiple of local {local} x dp {dp}"])
    if gb > local * dp:
        adjusted.append(f"gradient accumulation: {gb // (local * dp)} passes of local {local} a step")
    return seq, local, gb // (local * dp)


def _flavor_model(flavor: Flavor, seq_len: int) -> ModelSource:
    """A flavor no preset has the sizes of (the debug model), as a Llama architecture."""
    name = f"torchtitan-llama3-{flavor.flavor}"
    return ModelSource(name, config=TransformerConfig(
        family="llama", name=name, layers=flavor.layers, hidden=flavor.hidden, heads=flavor.heads,
        kv_heads=flavor.kv_heads, ffn=flavor.ffn, vocab=flavor.vocab, seq_len=seq_len, tied_embeddings=False))


def _stages(job: Job, values: Mapping[str, str], pp: int, schedule: Schedule,
            adjusted: list[str]) -> tuple[int, tuple[int, ...] | None]:
    """(virtual stages per rank, blocks per stage when uneven): from ``module_fqns_per_model_part``
    when given, else torchtitan's own split."""
    layers = job.flavor.layers
    if pp == 1:
        return 1, None
    if job.parts:
        if len(job.parts) % pp:
            raise ImportProblemError(KIND, [f"{len(job.parts)} model parts over {pp} pipeline ranks"])
        counts = tuple(sum(1 for m in p.split(",") if m.startswith("layers.")) for p in job.parts)
        if sum(counts) != layers:
            raise ImportProblemError(KIND, [f"the model parts hold {sum(counts)} of the {layers} layers"])
    else:
        first = _count(values, "parallelism.pipeline_parallel_first_stage_less_layers")
        last = _count(values, "parallelism.pipeline_parallel_last_stage_less_layers")
        per_stage = values["parallelism.pipeline_parallel_layers_per_stage"]
        try:
            per = stages_per_rank(schedule.chunked, pp, layers, first, last,
                                  _num(values, "parallelism.pipeline_parallel_layers_per_stage") if per_stage else None)
            counts = default_stage_layers(pp * per, layers, first, last)
        except ValueError as e:
            raise ImportProblemError(KIND, [str(e)]) from None
        adjusted.append(f"pipeline stages as torchtitan splits them ({per} per rank; the first stage {first} and the "
                        f"last {last} layer(s) less): {', '.join(map(str, counts))} blocks")
    virtual = len(counts) // pp
    return virtual, None if len(set(counts)) == 1 else counts


def _count(values: Mapping[str, str], key: str) -> int:
    text = values[key]
    if not text.isdigit():
        raise ImportProblemError(KIND, [f"{key} {text!r} is not a whole number"])
    return int(text)


__all__ = ["KIND", "RUN_TRAIN_DEFAULTS", "Job", "price_job", "read_torchtitan_args",
           "read_torchtitan_config", "split_launch"]

"""torchtitan 0.3.0 job arguments (``torchtitan_args.txt`` as ``parplan export`` writes it, one token a
line, or a ``torchrun ... -m torchtitan.train ...`` line).

The model is the llama3 registry flavor ``--module``/``--config`` name (sizes in
:data:`parplan.exports.torchtitan.FLAVORS`), matched to the parplan preset of the same sizes. The
degrees come from ``--parallelism.*``, the batch from ``--training.*`` (with pipelining the local
batch is split into micro-batches of ``pipeline_parallel_microbatch_size``; without, torchtitan
accumulates ``global / (local x dp)`` passes), recomputation from the ``activation_checkpoint:MODE``
subcommand: ``full`` is parplan's full recomputation, ``none`` parplan's selective one (with flash
attention they keep the same tensors). Priced with the PyTorch-native runtime's buffers.
"""

from __future__ import annotations

import itertools
import shlex

from parplan.exports.torchtitan import CONFIG_MODULE, FLAVORS, SCHEDULES, Flavor
from parplan.imports.common import Imported, ImportProblemError, refusals_as_problems, world_size
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.runtime import Runtime
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.frontends.presets import PRESETS
from parplan.solver.models import ModelSource
from parplan.solver.strategy import ParallelConfig, Schedule

KIND = "torchtitan-config"

#: ``parallelism.spmd_backend`` values of torchtitan 0.3.0 (priced alike).
SPMD_BACKENDS = ("spmd_types", "partial_dtensor", "full_dtensor")

_VALUED = {"module", "config", "training.seq_len", "training.local_batch_size", "training.global_batch_size",
           "training.dtype", "training.mixed_precision_param", "training.mixed_precision_reduce",
           "parallelism.data_parallel_replicate_degree", "parallelism.data_parallel_shard_degree",
           "parallelism.fsdp_reshard_after_forward", "parallelism.tensor_parallel_degree",
           "parallelism.context_parallel_degree", "parallelism.expert_parallel_degree",
           "parallelism.pipeline_parallel_degree", "parallelism.pipeline_parallel_schedule",
           "parallelism.pipeline_parallel_microbatch_size", "parallelism.spmd_backend"}
_SWITCHES = {"parallelism.enable_sequence_parallel", "parallelism.no_enable_sequence_parallel",
             "training.disable_cuda_graphs"}
#: sections that do not change memory or time as parplan prices them
_IGNORED_SECTIONS = ("job.", "metrics.", "checkpoint.", "optimizer.", "lr_scheduler.", "dataloader.", "comm.",
                     "validation.", "profiling.", "debug.", "fault_tolerance.", "compile.")
_IGNORED = {"training.steps", "training.dataset", "training.dataset_path", "training.max_norm", "training.seed",
            "training.deterministic", "hf_assets_path"}


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


def read_torchtitan_config(text: str, gpus: int | None = None) -> Imported:
    """The model, strategy and batch of torchtitan 0.3.0 arguments on ``gpus`` devices (from a
    torchrun line when it says)."""
    launcher, words = split_launch(text)
    nodes = procs = None
    for w in launcher:
        name, _, given = w.partition("=")
        if name == "--nnodes" and given.isdigit():
            nodes = int(given)
        if name in ("--nproc-per-node", "--nproc_per_node") and given.isdigit():
            procs = int(given)
    for w, following in itertools.pairwise(launcher):
        if w == "--nnodes" and following.isdigit():
            nodes = int(following)
        if w in ("--nproc-per-node", "--nproc_per_node") and following.isdigit():
            procs = int(following)
    values: dict[str, str] = {}
    switches: set[str] = set()
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
        if key in _SWITCHES:
            switches.add(key)
            continue
        value: str | None = inline if eq else None
        if value is None and i < len(words) and not words[i].startswith("--") and ":" not in words[i]:
            value = words[i]
            i += 1
        if key in _VALUED:
            if value is None:
                raise ImportProblemError(KIND, [f"{name} needs a value"])
            values[key] = value
        elif key in _IGNORED or key.startswith(_IGNORED_SECTIONS):
            ignored.append(name)
        else:
            unknown.append(name if value is None else f"{name} {value}")
    world = world_size(KIND, nodes, procs, gpus)
    return _imported(values, switches, parts, ac, world, procs, unknown, ignored)


def _num(values: dict[str, str], key: str, default: int | None = None) -> int:
    text = values.get(key)
    if text is None:
        if default is None:
            raise ImportProblemError(KIND, [f"missing --{key}"])
        return default
    if not text.isdigit() or int(text) < 1:
        raise ImportProblemError(KIND, [f"--{key} {text!r} is not a positive integer"])
    return int(text)


def _imported(values: dict[str, str], switches: set[str], parts: list[str], ac: str | None, world: int,
              per_node: int | None, unknown: list[str], ignored: list[str]) -> Imported:
    flavor = _flavor_of(values)
    preset = _preset_of(flavor)
    problems = _unmodelled(values)
    replicate, shard, tp, pp = _degrees(values, world, problems)
    reshard = values.get("parallelism.fsdp_reshard_after_forward", "default")
    if reshard not in ("default", "always", "never"):
        problems.append(f"--parallelism.fsdp_reshard_after_forward {reshard}")
    zero = (3 if reshard == "always" or (reshard == "default" and pp == 1) else 2) if shard > 1 else 0
    mode = ac or "none"
    recompute = {"full": Recompute.FULL, "none": Recompute.SELECTIVE}.get(mode)
    if recompute is None:
        problems.append(f"activation_checkpoint:{mode} (torchtitan's own selective checkpointing) is not modelled; "
                        "full and none are")
    precision = {"bfloat16": "bf16", "float32": "fp32"}.get(values.get("training.mixed_precision_param", "bfloat16"))
    if precision is None:
        problems.append(f"--training.mixed_precision_param {values['training.mixed_precision_param']}")
    schedule_name = values.get("parallelism.pipeline_parallel_schedule", "1F1B")
    schedule = {v: Schedule(k) for k, v in SCHEDULES.items()}.get(schedule_name)
    if pp > 1 and schedule is None:
        problems.append(f"pipeline schedule {schedule_name}")
    backend = values.get("parallelism.spmd_backend", "spmd_types")
    if backend not in SPMD_BACKENDS:
        problems.append(f"--parallelism.spmd_backend {backend} (torchtitan 0.3.0 has {', '.join(SPMD_BACKENDS)})")
    if problems:
        raise ImportProblemError(KIND, problems)
    assert recompute is not None and precision is not None
    dp = replicate * shard
    seq, mb, m = _batch(values, pp, dp)
    virtual, partition = _stages(parts, pp, flavor.layers)
    with refusals_as_problems(KIND):
        strategy = ParallelConfig(
            tp=tp, pp=pp, dp=dp, zero=zero,
            sequence_parallel=tp > 1 and "parallelism.no_enable_sequence_parallel" not in switches,
            recompute=recompute, micro_batch=mb, num_microbatches=m,
            schedule=(schedule or Schedule.ONE_F_ONE_B) if pp > 1 else Schedule.ONE_F_ONE_B,
            virtual_stages=virtual, precision=precision, partition=partition, runtime=Runtime.TORCHTITAN)
    model = ModelSource(preset, config=PRESETS[preset]) if preset else _flavor_model(flavor, seq)
    unpriced = [] if "training.disable_cuda_graphs" in switches else [
        "CUDA graphs (torchtitan's default without --training.disable_cuda_graphs) keep memory pools the "
        "prediction leaves out"]
    return Imported(KIND, model, strategy, seq, world, per_node, "torchtitan", unknown, ignored, unpriced)


def _flavor_of(values: dict[str, str]) -> Flavor:
    """The llama3 flavor ``--config`` names."""
    flavor = next((f for f in FLAVORS if f.config == values.get("config")), None)
    if flavor is None:
        raise ImportProblemError(KIND, [f"--config {values.get('config')!r} is none of torchtitan 0.3.0's llama3 "
                                        f"recipes parplan knows ({', '.join(f.config for f in FLAVORS)})"])
    return flavor


def _preset_of(flavor: Flavor) -> str | None:
    """The parplan preset with the flavor's sizes (an untied Llama), if one has them."""
    sizes = flavor.sizes()
    return next((name for name, c in PRESETS.items() if c.family == "llama" and not c.tied_embeddings
                 and {"layers": c.layers, "hidden": c.hidden, "heads": c.heads, "kv_heads": c.n_kv_heads,
                      "ffn": c.ffn, "vocab": c.vocab, "head_dim": c.d_head} == sizes), None)


def _unmodelled(values: dict[str, str]) -> list[str]:
    """The module, dtypes and degrees parplan does not price as torchtitan would run them."""
    problems: list[str] = []
    module = values.get("module", "llama3")
    if module not in ("llama3", CONFIG_MODULE):
        problems.append(f"--module {module}: parplan reads torchtitan's llama3 recipes only")
    if values.get("training.dtype", "float32") != "float32":
        problems.append(f"--training.dtype {values['training.dtype']}: parplan keeps float32 weights and "
                        "optimizer states")
    if values.get("training.mixed_precision_reduce", "float32") != "float32":
        problems.append("gradients reduced in "
                        f"{values['training.mixed_precision_reduce']} (--training.mixed_precision_reduce)")
    if _num(values, "parallelism.context_parallel_degree", 1) > 1:
        problems.append("context parallelism is not modelled yet")
    if _num(values, "parallelism.expert_parallel_degree", 1) > 1:
        problems.append("expert parallelism of a dense Llama")
    return problems


def _degrees(values: dict[str, str], world: int, problems: list[str]) -> tuple[int, int, int, int]:
    """(replicate, shard, tp, pp) on ``world`` GPUs (shard -1: the GPUs the others leave)."""
    replicate = _num(values, "parallelism.data_parallel_replicate_degree", 1)
    shard_text = values.get("parallelism.data_parallel_shard_degree", "-1")
    tp = _num(values, "parallelism.tensor_parallel_degree", 1)
    pp = _num(values, "parallelism.pipeline_parallel_degree", 1)
    if world % (tp * pp * replicate):
        raise ImportProblemError(KIND, [f"tp x pp x replicate = {tp * pp * replicate} does not divide {world} GPUs"])
    shard = world // (tp * pp * replicate) if shard_text == "-1" else _num(values,
                                                                           "parallelism.data_parallel_shard_degree")
    if tp * pp * replicate * shard != world:
        problems.append(f"tp {tp} x pp {pp} x replicate {replicate} x shard {shard} is not the {world} GPUs")
    if replicate > 1 and shard > 1:
        problems.append("hybrid sharding (replicate and shard degrees both above 1) is not modelled yet")
    return replicate, shard, tp, pp


def _batch(values: dict[str, str], pp: int, dp: int) -> tuple[int, int, int]:
    """(sequence length, micro-batch, micro-batches per step): with pipelining the local batch is split
    into micro-batches; without, torchtitan accumulates ``global / (local x dp)`` passes."""
    seq = _num(values, "training.seq_len")
    local = _num(values, "training.local_batch_size")
    gb = _num(values, "training.global_batch_size", local * dp)
    if pp > 1:
        mb = _num(values, "parallelism.pipeline_parallel_microbatch_size", 1)
        if local % mb or gb != local * dp:
            raise ImportProblemError(KIND, [f"with pipelining the local batch {local} must be micro-batches of {mb} "
                                            f"and the global batch {gb} = local x dp {dp}"])
        return seq, mb, local // mb
    if gb % (local * dp):
        raise ImportProblemError(KIND, [f"global batch {gb} is not a multiple of local {local} x dp {dp}"])
    return seq, local, gb // (local * dp)


def _flavor_model(flavor: Flavor, seq_len: int) -> ModelSource:
    """A flavor no preset has the sizes of (the debug model), as a Llama architecture."""
    name = f"torchtitan-llama3-{flavor.flavor}"
    return ModelSource(name, config=TransformerConfig(
        family="llama", name=name, layers=flavor.layers, hidden=flavor.hidden, heads=flavor.heads,
        kv_heads=flavor.kv_heads, ffn=flavor.ffn, vocab=flavor.vocab, seq_len=seq_len, tied_embeddings=False))


def _stages(parts: list[str], pp: int, layers: int) -> tuple[int, tuple[int, ...] | None]:
    """(virtual stages per rank, blocks per stage when uneven) from ``module_fqns_per_model_part``."""
    if pp == 1 or not parts:
        return 1, None
    if len(parts) % pp:
        raise ImportProblemError(KIND, [f"{len(parts)} model parts over {pp} pipeline ranks"])
    counts = [sum(1 for m in p.split(",") if m.startswith("layers.")) for p in parts]
    if sum(counts) != layers:
        raise ImportProblemError(KIND, [f"the model parts hold {sum(counts)} of the {layers} layers"])
    virtual = len(parts) // pp
    if len(set(counts)) == 1:
        return virtual, None
    if virtual > 1:
        raise ImportProblemError(KIND, ["uneven stages with several stages per rank are not modelled"])
    return 1, tuple(counts)

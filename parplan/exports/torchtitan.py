"""torchtitan: the arguments of ``torchrun -m torchtitan.train`` and a launch script per node.

Pinned to torchtitan 0.3.0. There a job is a Python config (``Trainer.Config``) returned by a
function of a module's config registry, picked with ``--module <module> --config <function>``, then
changed field by field with ``--<section>.<field> <value>`` (tyro; a boolean is a flag, ``--s.f`` or
``--s.no_f``). Activation checkpointing is a tyro subcommand (``activation_checkpoint:full`` ...),
which must come after every other option. The model (``model_spec``) is not a command-line field:
its sizes come only from the registry, so a plan's model must be one of the llama3 module's flavors.
``torchtitan.train`` reads the world size from ``torchrun``; its degrees must multiply to it.

What is written: the registry config of the model, the data-parallel (FSDP2), tensor, sequence and
pipeline parallel settings, the layers of each pipeline stage, batch sizes, sequence length,
activation checkpointing and mixed precision. Data set, tokenizer (``hf_assets_path``), optimizer and
step count stay the recipe's: the notes say so.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from parplan.exports import torchtitan_float8 as float8
from parplan.exports.common import (
    SIZES_HINT,
    Export,
    NotExpressible,
    PlanContext,
    UniformPlan,
    context_of,
    uniform_of,
)
from parplan.solver.cost.pipeline import even_partition
from parplan.solver.cost.runtime import TORCHTITAN_LOSS_CHUNKS

TORCHTITAN_VERSION = "0.3.0"
TARGET = "torchtitan"

#: The files of an export.
ARGS_FILE = "torchtitan_args.txt"
SCRIPT_FILE = "launch_torchtitan.sh"
#: A config registry the export writes when torchtitan's own recipe for the model cannot be made to
#: match the plan from the command line (importable by this name with the export's folder on PYTHONPATH).
CONFIG_MODULE = "parplan_torchtitan_config"

#: The longest sequence torchtitan's llama3 flavors take (their RoPE tables), tokens.
ROPE_MAX_SEQ_LEN = 131072

#: torchtitan's SPMD backend the export selects. 0.3.0's default, ``spmd_types``, hands FSDP2 plain
#: parameters annotated with their layout; torch 2.13's ``fully_shard`` refuses them once the data-parallel
#: mesh has more than one rank ("all parameters must be DTensors on the full SPMD mesh", measured with
#: torch 2.13.0 and torchtitan 0.3.0). ``partial_dtensor`` (DTensors for tensor parallelism only, FSDP2 on
#: the data-parallel mesh) runs on it.
SPMD_BACKEND = "partial_dtensor"

#: parplan's pipeline schedules -> torch.distributed.pipelining's schedule names (torchtitan passes
#: ``parallelism.pipeline_parallel_schedule`` to ``get_schedule_class``).
SCHEDULES = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved": "Interleaved1F1B",
             "interleaved-zb": "InterleavedZeroBubble", "zbv": "ZBVZeroBubble", "dualpipev": "DualPipeV"}
#: Schedules torchtitan builds as several stages per rank (PipelineScheduleMulti: at least 2).
MULTI_STAGE = ("interleaved", "interleaved-zb", "zbv", "dualpipev")


@dataclass(frozen=True)
class Flavor:
    """One model of torchtitan 0.3.0's llama3 module: its flavor, the config function that trains it
    and its sizes (elements). ``written``: the function is in :data:`CONFIG_MODULE`, written by the export."""

    flavor: str
    config: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    written: bool = False

    @property
    def module(self) -> str:
        return CONFIG_MODULE if self.written else "llama3"

    def sizes(self) -> dict[str, int]:
        return {"layers": self.layers, "hidden": self.hidden, "heads": self.heads, "kv_heads": self.kv_heads,
                "ffn": self.ffn, "vocab": self.vocab, "head_dim": self.hidden // self.heads}


#: The llama3 flavors with a training recipe in 0.3.0 (``llama3_debugmodel``, ``llama3_8b``, ``llama3_70b``,
#: ``llama3_405b``; untied embeddings). The debug model (6 layers, hidden 256) is torchtitan's own test
#: model, small enough for ``parplan validate --torchtitan`` on a CPU. The 405B recipe makes its linear
#: layers (but the output) Float8 (torchao) inside its model spec, which no option undoes, so a bf16 plan
#: gets a config function of its own (:data:`CONFIG_MODULE`).
FLAVORS: tuple[Flavor, ...] = (
    Flavor("debugmodel", "llama3_debugmodel", 6, 256, 16, 16, 768, 2048),
    Flavor("8B", "llama3_8b", 32, 4096, 32, 8, 14336, 128256),
    Flavor("70B", "llama3_70b", 80, 8192, 64, 8, 28672, 128256),
    Flavor("405B", "llama3_405b_bf16", 126, 16384, 128, 8, 53248, 128256, written=True),
)

_CONFIG_MODULE_TEXT = '''"""Config registry written by parplan for torchtitan 0.3.0.

Use with ``--module parplan_torchtitan_config --config <function>``, this folder on PYTHONPATH.
"""

from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw
from torchtitan.models.llama3 import model_registry
from torchtitan.models.llama3.config_registry import llama3_70b


def llama3_405b_bf16():
    """Llama 3.1 405B in bf16 mixed precision: torchtitan's llama3_405b recipe without its Float8
    linear layers and torch.compile (the 70B recipe's settings with the 405B model, learning rate,
    warm-up and step count)."""
    config = llama3_70b()
    config.model_spec = model_registry("405B")
    config.hf_assets_path = "./assets/hf/Llama-3.1-405B"
    config.optimizer = default_adamw(lr=8e-5)
    config.lr_scheduler = LRSchedulersContainer.Config(warmup_steps=600)
    config.training.steps = 3000
    return config
'''


def export_torchtitan(doc: Mapping[str, Any]) -> Export:
    """The plan document ``doc`` as a torchtitan 0.3.0 job: ``torchtitan_args.txt`` (one argument a
    line), ``launch_torchtitan.sh`` (run on every node) and, for 405B, the config registry it imports.
    NotExpressible names every part of the plan torchtitan cannot run."""
    reasons: list[str] = []
    plan: UniformPlan | None = None
    ctx: PlanContext | None = None
    try:
        plan = uniform_of(doc, TARGET)
    except NotExpressible as e:
        reasons += e.reasons
    try:
        ctx = context_of(doc)
    except NotExpressible as e:
        reasons += e.reasons
    flavor = _flavor(ctx, reasons) if ctx is not None else None
    if plan is not None and ctx is not None:
        _check(plan, ctx, flavor, reasons)
    if reasons:
        raise NotExpressible(TARGET, reasons)
    assert plan is not None and ctx is not None and flavor is not None
    strategy = doc.get("strategy") or {}
    module_text = _CONFIG_MODULE_TEXT if flavor.written else None
    if plan.precision in float8.RECIPES:
        imported = (module_text or _CONFIG_MODULE_TEXT).replace("\n\n\ndef ", "\n" + float8.IMPORTS + "\n\ndef ", 1)
        module_text = imported + float8.function_text(flavor.flavor, flavor.config, flavor.written, plan.precision)
        flavor = dataclasses.replace(flavor, config=float8.function_name(flavor.config, plan.precision), written=True)
    args = torchtitan_arguments(plan, ctx, flavor)
    summary = " ".join(str(strategy.get("summary") or _summary(plan)).split())  # one line
    files = {ARGS_FILE: "\n".join(args) + "\n", SCRIPT_FILE: _script(plan, ctx, flavor, args, summary)}
    if module_text is not None:
        files[CONFIG_MODULE + ".py"] = module_text
    return Export(TARGET, TORCHTITAN_VERSION, files, _launch_lines(ctx, flavor, args),
                  _notes(plan, ctx, flavor, strategy))


def torchtitan_arguments(plan: UniformPlan, ctx: PlanContext, flavor: Flavor) -> list[str]:
    """The arguments after ``-m torchtitan.train``, one token each (the plan checked already)."""
    pp_on = plan.pp > 1
    local = plan.micro_batch * plan.num_microbatches if pp_on else plan.micro_batch
    sharded = plan.dp > 1 and plan.zero >= 2
    args = ["--module", flavor.module, "--config", flavor.config,
            "--training.seq_len", str(ctx.seq_len),
            "--training.local_batch_size", str(local),
            "--training.global_batch_size", str(plan.global_batch),
            "--training.dtype", "float32",
            "--training.mixed_precision_param", "float32" if plan.precision == "fp32" else "bfloat16",
            "--training.mixed_precision_reduce", "float32",
            "--training.disable_cuda_graphs",
            "--parallelism.data_parallel_replicate_degree", str(plan.replicate if sharded else plan.dp),
            "--parallelism.data_parallel_shard_degree", str(plan.shard if sharded else 1),
            "--parallelism.fsdp_reshard_after_forward", "always" if plan.zero == 3 else "never",
            "--parallelism.tensor_parallel_degree", str(plan.tp),
            "--parallelism.enable_sequence_parallel" if plan.sequence_parallel
            else "--parallelism.no_enable_sequence_parallel",
            "--parallelism.context_parallel_degree", "1",
            "--parallelism.spmd_backend", SPMD_BACKEND,
            "--parallelism.expert_parallel_degree", "1",
            "--parallelism.pipeline_parallel_degree", str(plan.pp)]
    if pp_on:
        args += ["--parallelism.pipeline_parallel_schedule", _schedule(plan),
                 "--parallelism.pipeline_parallel_microbatch_size", str(plan.micro_batch),
                 "--parallelism.module_fqns_per_model_part",
                 *(",".join(stage) for stage in stage_modules(_stage_blocks(plan, flavor.layers)))]
    args += ["--compile.no_enable", "--compile.no_enable_async_tensor_parallel",
             f"activation_checkpoint:{_AC_SUBCOMMAND.get(plan.recompute, 'none')}"]
    return args


#: parplan's recomputation -> torchtitan's activation_checkpoint subcommand (``distributed/activation_checkpoint.py``:
#: ``selective`` is ``SelectiveAC``, the per-operator policy; parplan's selective keeps what no checkpointing keeps
#: with a flash kernel, so it is none)
_AC_SUBCOMMAND = {"full": "full", "op": "selective"}


def stage_modules(blocks_per_stage: tuple[int, ...]) -> list[list[str]]:
    """Module names of each (virtual) pipeline stage in torchtitan's llama3 model: the embedding on
    the first stage, the final norm and output layer on the last (where parplan puts them)."""
    out: list[list[str]] = []
    start = 0
    for i, count in enumerate(blocks_per_stage):
        names = [f"layers.{b}" for b in range(start, start + count)]
        if i == 0:
            names.insert(0, "tok_embeddings")
        if i == len(blocks_per_stage) - 1:
            names += ["norm", "lm_head"]
        out.append(names)
        start += count
    return out


def _virtual(plan: UniformPlan) -> int:
    """Stages per pipeline rank: the plan's virtual stages under the interleaved schedules, else 1."""
    return plan.virtual_stages if plan.schedule in MULTI_STAGE else 1


def _schedule(plan: UniformPlan) -> str:
    # interleaved with one stage per rank is 1F1B (parplan prices it so)
    if plan.schedule == "interleaved" and plan.virtual_stages == 1:
        return SCHEDULES["1f1b"]
    return SCHEDULES[plan.schedule]


def _stage_blocks(plan: UniformPlan, layers: int) -> tuple[int, ...]:
    """Blocks per (virtual) stage: the plan's partition, else parplan's even split."""
    return plan.partition or even_partition(layers, plan.pp * _virtual(plan))


def _flavor(ctx: PlanContext, reasons: list[str]) -> Flavor | None:
    """The llama3 flavor whose sizes are the plan's model's; appends why there is none."""
    arch = ctx.architecture
    if arch is None:
        reasons.append(f"{ctx.model_name} is an operator graph without an architecture; torchtitan trains the "
                       f"models of its registry ({SIZES_HINT})")
        return None
    family = str(arch.get("family"))
    if family == "mixtral":
        reasons.append(f"{ctx.model_name} is a Mixtral model; torchtitan 0.3.0 has no Mixtral module (its "
                       "mixture-of-experts modules, deepseek_v3, qwen3, gpt_oss and kimi_k2_7, are other "
                       "architectures)")
        return None
    if family != "llama":
        reasons.append(f"{ctx.model_name} is a {family} model; torchtitan 0.3.0 has no {family} module (parplan "
                       "maps only Llama models, to torchtitan's llama3 module)")
        return None
    heads = int(arch["heads"])
    sizes = {"layers": int(arch["layers"]), "hidden": int(arch["hidden"]), "heads": heads,
             "kv_heads": int(arch.get("kv_heads") or heads), "ffn": int(arch["ffn"]), "vocab": int(arch["vocab"]),
             "head_dim": int(arch.get("head_dim") or int(arch["hidden"]) // heads)}
    if arch.get("tied_embeddings"):
        reasons.append(f"{ctx.model_name} ties its embeddings; torchtitan 0.3.0's llama3 recipes (debugmodel, 8B, 70B, "
                       "405B) "
                       "have untied ones")
        return None
    for f in FLAVORS:
        if f.sizes() == sizes:
            return f
    nearest = min(FLAVORS, key=lambda f: sum(f.sizes()[k] != v for k, v in sizes.items()))
    differ = ", ".join(f"{k} {v} (not {nearest.sizes()[k]})" for k, v in sizes.items() if nearest.sizes()[k] != v)
    reasons.append(f"no torchtitan 0.3.0 llama3 flavor has {ctx.model_name}'s sizes: nearest is {nearest.flavor}, "
                   f"which differs in {differ}; 0.3.0 takes no model sizes from the command line (the model "
                   "spec is not a command-line field)")
    return None


def _check(plan: UniformPlan, ctx: PlanContext, flavor: Flavor | None, reasons: list[str]) -> None:
    """Appends every setting of ``plan`` that torchtitan 0.3.0 cannot run as planned."""
    if plan.world != ctx.gpus:
        reasons.append(f"the plan uses {plan.degrees} GPUs of the cluster's {ctx.gpus}; torchtitan "
                       "needs its degrees to multiply to the world size")
    if ctx.gpus != ctx.nodes * ctx.procs_per_node:
        reasons.append(f"{ctx.gpus} GPUs are not whole nodes of {ctx.host_gpus}; torchrun starts the same "
                       "number of processes on every node")
    if plan.dp > 1 and plan.zero == 1:
        reasons.append("ZeRO-1 (optimizer states sharded, weights and gradients whole): torchtitan shards "
                       "weights, gradients and optimizer states together (FSDP2) or replicates all three")
    if plan.zero not in (0, 1, 2, 3):
        reasons.append(f"ZeRO stage {plan.zero}")
    if plan.dp_shard and (plan.dp % plan.dp_shard or plan.zero < 2):
        reasons.append(f"dp_shard {plan.dp_shard} with dp {plan.dp} and ZeRO-{plan.zero}: torchtitan's HSDP "
                       "(data_parallel_shard_degree x data_parallel_replicate_degree) shards weights, gradients "
                       "and optimizer states together (ZeRO 2 or 3) in groups that divide dp")
    if plan.expert_parallel > 1:
        reasons.append(f"expert parallelism ({plan.expert_parallel}): the model has no experts in torchtitan's "
                       "llama3 module")
    if plan.cp > 1:
        reasons.append(f"context parallelism (cp={plan.cp}): torchtitan {TORCHTITAN_VERSION}'s llama3 runs "
                       "FlexAttention, whose context parallelism all-gathers every layer's keys and values and keeps "
                       "them for backward (parallelism.context_parallel_degree), and shards the weights over the "
                       "context-parallel ranks with FSDP2; the plan prices Megatron-LM's p2p ring, which holds one "
                       "chunk, so its memory would be under-predicted (export it with --target megatron)")
    if plan.precision in float8.REFUSED:
        reasons.append(f"precision {plan.precision}: {float8.REFUSED[plan.precision]}")
    elif plan.precision not in ("bf16", "fp32", *float8.RECIPES):
        reasons.append(f"precision {plan.precision}: torchtitan 0.3.0 computes in bfloat16 or float32 and "
                       "reduces gradients in float32 only")
    if plan.micro_batch * plan.num_microbatches * plan.dp != plan.global_batch:
        reasons.append(f"global batch {plan.global_batch} is not micro-batch {plan.micro_batch} x "
                       f"{plan.num_microbatches} micro-batches x dp {plan.dp}")
    if not 0 < ctx.seq_len <= ROPE_MAX_SEQ_LEN:
        reasons.append(f"sequence length {ctx.seq_len}: torchtitan's llama3 takes 1 to {ROPE_MAX_SEQ_LEN} tokens")
    if plan.recompute not in ("none", "selective", "full", "op"):
        reasons.append(f"recomputation {plan.recompute!r}")
    if flavor is not None and plan.tp > 1:
        for what, n in (("heads", flavor.heads), ("kv heads", flavor.kv_heads)):
            if n % plan.tp:
                reasons.append(f"tp={plan.tp} does not divide the {n} {what} (torchtitan requires it)")
        if plan.sequence_parallel and ctx.seq_len % plan.tp:
            reasons.append(f"sequence parallelism over tp={plan.tp} needs the sequence length ({ctx.seq_len}) to "
                           "be a multiple of it")
    if plan.pp > 1:
        _check_pipeline(plan, flavor, reasons)


def _check_pipeline(plan: UniformPlan, flavor: Flavor | None, reasons: list[str]) -> None:
    if plan.schedule not in SCHEDULES:
        reasons.append(f"pipeline schedule {plan.schedule!r}")
        return
    v = _virtual(plan)
    stages = plan.pp * v
    if plan.schedule in ("interleaved", "interleaved-zb") and v > 1:
        rounds = max(1, plan.num_microbatches // plan.pp)
        if plan.num_microbatches % rounds:
            reasons.append(f"torch's {SCHEDULES[plan.schedule]} needs the micro-batch count ({plan.num_microbatches}) "
                           f"to be a multiple of {rounds} (micro-batches // pp)")
    if plan.schedule in ("interleaved-zb", "zbv", "dualpipev") and v < 2:
        reasons.append(f"torchtitan builds {SCHEDULES[plan.schedule]} with at least 2 stages per rank (a "
                       "PipelineScheduleMulti), the plan has 1")
    if flavor is None:
        return
    if plan.partition is not None:
        if len(plan.partition) != stages or sum(plan.partition) != flavor.layers or min(plan.partition) < 1:
            reasons.append(f"partition {list(plan.partition)} does not give each of the {stages} pipeline stages "
                           f"at least one of the {flavor.layers} blocks")
    elif stages > flavor.layers:
        reasons.append(f"{stages} pipeline stages for {flavor.layers} blocks")


def _summary(plan: UniformPlan) -> str:
    parts = [f"tp{plan.tp}", f"pp{plan.pp}", f"dp{plan.dp}", f"zero{plan.zero}"]
    if plan.sequence_parallel:
        parts.append("sp")
    parts += [f"recompute={plan.recompute}", f"mb{plan.micro_batch}x{plan.num_microbatches}", plan.schedule]
    if _virtual(plan) > 1:
        parts[-1] += f"(v={plan.virtual_stages})"
    return " ".join(parts)


def _torchrun(ctx: PlanContext, node_rank: str) -> list[str]:
    """torchrun's options for one node (rendezvous at ``$MASTER_ADDR:$MASTER_PORT``)."""
    return [f"--nnodes={ctx.nodes}", f"--nproc-per-node={ctx.procs_per_node}", f"--node-rank={node_rank}",
            '--master-addr="$MASTER_ADDR"', '--master-port="$MASTER_PORT"']


def _launch_lines(ctx: PlanContext, flavor: Flavor, args: list[str]) -> list[str]:
    """One command line per node, run from the export's folder with MASTER_ADDR and MASTER_PORT set."""
    env = "PYTORCH_ALLOC_CONF=expandable_segments:True "
    if flavor.written:
        env += 'PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" '
    return [env + " ".join(["torchrun", *_torchrun(ctx, str(rank)), "-m", "torchtitan.train", shlex.join(args)])
            for rank in range(ctx.nodes)]


def _script(plan: UniformPlan, ctx: PlanContext, flavor: Flavor, args: list[str], summary: str) -> str:
    """``launch_torchtitan.sh``: the torchrun command, the same on every node but for NODE_RANK."""
    last = ctx.nodes - 1
    lines = [
        "#!/usr/bin/env bash",
        f"# torchtitan {TORCHTITAN_VERSION} job written by parplan (pip install torchtitan=={TORCHTITAN_VERSION} and",
        "# the torch it pins). Run once on every node, from a folder holding the recipe's assets",
        "# (hf_assets_path: the tokenizer) and this export's files:",
        f"#   NODE_RANK=<0..{last}> MASTER_ADDR=<node 0's address> MASTER_PORT=<free port> ./{SCRIPT_FILE} "
        "[--section.field value ...]",
        "# Extra options go before the activation_checkpoint subcommand, which tyro needs last.",
        "#",
        f"# model:  {ctx.model_name} = torchtitan's llama3 flavor {flavor.flavor} "
        f"(--module {flavor.module} --config {flavor.config})",
        f"# plan:   {summary}",
        f"# GPUs:   {ctx.gpus} = {ctx.nodes} node(s) x {ctx.procs_per_node}; "
        f"tp {plan.tp} x pp {plan.pp} x dp {plan.dp}",
        f"# batch:  {plan.global_batch} sequences of {ctx.seq_len} tokens a step = dp {plan.dp} x "
        f"{plan.num_microbatches} micro-batches of {plan.micro_batch} "
        + ("(pipelined)" if plan.pp > 1 else "(gradient accumulation)"),
        "set -euo pipefail",
        f"NNODES={ctx.nodes}",
        f"NPROC_PER_NODE={ctx.procs_per_node}",
    ]
    if ctx.nodes == 1:
        lines += ['NODE_RANK="${NODE_RANK:-0}"', 'MASTER_ADDR="${MASTER_ADDR:-localhost}"',
                  'MASTER_PORT="${MASTER_PORT:-29500}"']
    else:
        lines += [f': "${{NODE_RANK:?set NODE_RANK to the rank of this node, 0 to {last}}}"',
                  ': "${MASTER_ADDR:?set MASTER_ADDR to the address of node 0}"',
                  ': "${MASTER_PORT:?set MASTER_PORT to a free port on node 0}"']
    lines += ["# torchtitan's own launcher (run_train.sh) sets this allocator option",
              'export PYTORCH_ALLOC_CONF="${PYTORCH_ALLOC_CONF:-expandable_segments:True}"']
    if flavor.written:
        lines += [f"# {CONFIG_MODULE}.py (the config registry of this job) is imported from this script's folder",
                  'HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
                  'export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"']
    command = ["exec torchrun " + " ".join(_torchrun(ctx, '"$NODE_RANK"')), "-m torchtitan.train"]
    command += _grouped(args[:-1])
    command += ['"$@"', shlex.quote(args[-1])]
    lines.append(" \\\n    ".join(command))
    return "\n".join(lines) + "\n"


def _grouped(args: list[str]) -> list[str]:
    """Each option with its values on one line (shell-quoted)."""
    out: list[list[str]] = []
    for a in args:
        if a.startswith("--") or not out:
            out.append([a])
        else:
            out[-1].append(a)
    return [shlex.join(group) for group in out]


def _notes(plan: UniformPlan, ctx: PlanContext, flavor: Flavor, strategy: Mapping[str, Any]) -> list[str]:
    """What the export decided, and what the user still provides."""
    return [*_model_notes(plan, ctx, flavor, strategy), *_parallel_notes(plan, flavor),
            *_step_notes(plan, flavor, strategy)]


def _model_notes(plan: UniformPlan, ctx: PlanContext, flavor: Flavor, strategy: Mapping[str, Any]) -> list[str]:
    """The flavor, its attention, and recomputation."""
    notes = [
        f"model: torchtitan's llama3 flavor {flavor.flavor} (Llama 3.1: {flavor.layers} layers, hidden "
        f"{flavor.hidden}, {flavor.heads} heads, {flavor.kv_heads} kv heads, ffn {flavor.ffn}, vocab "
        f"{flavor.vocab}), the sizes of {ctx.model_name}; its RoPE is Llama 3.1's (theta 500000, scaled), "
        "which parplan's costs do not depend on",
        "attention: torchtitan's llama3 runs FlexAttention (block-causal within each document, grouped-query "
        "without repeating K and V), which keeps no sequence-squared tensor for backward",
    ]
    if strategy.get("flash_attention") is False:
        notes.append("the plan assumed attention without flash attention (softmax scores kept for backward); "
                     "torchtitan's FlexAttention keeps none, so it needs less activation memory than planned")
    if plan.recompute == "selective":
        notes.append("recompute selective -> activation_checkpoint:none: parplan's selective recomputation "
                     "(Megatron-LM's: recompute the attention core) drops only the sequence-squared scores, "
                     "which flash/Flex attention never keeps, so it saves the same tensors as no recomputation; "
                     "torchtitan's own 'selective' (per-op: recompute every other matmul and the elementwise "
                     "ops) would keep less and recompute more than the plan")
    elif plan.recompute == "full":
        notes.append("recompute full -> activation_checkpoint:full: every transformer block is checkpointed and "
                     "keeps only its input")
    elif plan.recompute == "op":
        notes.append("recompute op -> activation_checkpoint:selective: torchtitan's per-operator policy (SelectiveAC) "
                     "keeps each block's input and the outputs of every other matmul and of attention")
    return notes


def _parallel_notes(plan: UniformPlan, flavor: Flavor) -> list[str]:
    """The data-, tensor- and pipeline-parallel options, the SPMD backend and the rank order."""
    notes: list[str] = []
    if plan.dp == 1:
        notes.append("no data parallelism (FSDP2 still wraps the model, on one rank, for mixed precision)")
    elif plan.zero >= 2:
        how = ("resharded after forward (ZeRO-3; 'always', since torchtitan's default keeps them under "
               "pipeline parallelism)" if plan.zero == 3 else
               "kept gathered from forward to backward (reshard_after_forward never: ZeRO-2)")
        if plan.replicate > 1:
            notes.append(f"dp {plan.dp}, ZeRO-{plan.zero}, shard groups of {plan.shard} -> HSDP: FSDP2 over "
                         f"{plan.shard} ranks (data_parallel_shard_degree) replicated {plan.replicate} times "
                         "(data_parallel_replicate_degree): gradients reduce-scattered in the shard group, "
                         f"their shards all-reduced across the replicas; weights {how}")
        else:
            notes.append(f"dp {plan.dp}, ZeRO-{plan.zero} -> FSDP2 over {plan.dp} ranks (data_parallel_shard_degree), "
                         f"weights {how}")
    else:
        notes.append(f"dp {plan.dp}, ZeRO-0 -> data_parallel_replicate_degree {plan.dp}: torchtitan replicates with "
                     "FSDP2 over a mesh of dp_replicate x dp_shard=1 (HSDP with a shard group of one, the machinery "
                     "of torch's replicate), not DDP: whole weights, gradients all-reduced")
    if plan.tp > 1:
        sp = ("on: norms and the residual stream sharded along the sequence, the output projections "
              "reduce-scattered" if plan.sequence_parallel else
              "off: norms run replicated and the output projections all-reduce")
        notes.append(f"tp {plan.tp}: attention heads and FFN columns/rows sharded; sequence parallelism {sp} "
                     "(parallelism.enable_sequence_parallel, on by default in 0.3.0, written explicitly); the "
                     "loss is always vocabulary-parallel under TP (no option in 0.3.0)")
    notes.append(f"parallelism.spmd_backend {SPMD_BACKEND}: torchtitan 0.3.0's default (spmd_types) needs a torch "
                 "whose FSDP2 takes layout-annotated plain parameters; torch 2.13's fully_shard refuses them when "
                 "the data-parallel degree is above 1. partial_dtensor (DTensor for tensor parallelism, FSDP2 over "
                 "the data-parallel mesh) runs on torch 2.13")
    notes.append("rank order: torchtitan's mesh is pp (outermost), data parallel, tp (innermost): tensor-parallel "
                 "ranks are adjacent, so tp <= GPUs per node keeps them on one node")
    if plan.pp > 1:
        v = _virtual(plan)
        blocks = list(_stage_blocks(plan, flavor.layers))
        notes.append(f"pp {plan.pp}: schedule {_schedule(plan)}" + (f" with {v} stages per rank" if v > 1 else "")
                     + f", {plan.num_microbatches} micro-batches of {plan.micro_batch} (local batch "
                     f"{plan.micro_batch * plan.num_microbatches} / pipeline_parallel_microbatch_size); blocks per "
                     f"stage {blocks} given by module_fqns_per_model_part (embedding on the first stage, final "
                     "norm and output on the last, as parplan places them; torchtitan's own split would give the "
                     "first and last stages one block fewer)")
        if plan.schedule == "interleaved" and v == 1:
            notes.append("interleaved schedule with one stage per rank written as 1F1B (what it runs)")
        if plan.schedule in ("zbv", "dualpipev"):
            notes.append(f"{SCHEDULES[plan.schedule]} places the stages in a V (torchtitan's "
                         "stage_ids_this_rank, style \"v\"): rank i runs stages i and 2pp-1-i, so rank 0 "
                         "holds the embedding and the output (as parplan prices it)")
    elif plan.num_microbatches > 1:
        notes.append(f"{plan.num_microbatches} micro-batches without pipelining -> gradient accumulation "
                     f"(global batch {plan.global_batch} / (local batch {plan.micro_batch} x dp {plan.dp})); "
                     "torchtitan reduces gradients after every accumulation pass (and the torchtitan runtime "
                     "prices it so)")
    return notes


def _step_notes(plan: UniformPlan, flavor: Flavor, strategy: Mapping[str, Any]) -> list[str]:
    """Precision, eager execution, the loss, the runtime priced, the config module, and what is the user's."""
    notes: list[str] = []
    prec = "bfloat16 compute, float32 weights, gradient reduction and optimizer states (FSDP2 mixed precision)" \
        if plan.precision != "fp32" else "float32 throughout"
    notes.append(f"precision {plan.precision} -> {prec}")
    if plan.precision in float8.RECIPES:
        notes.append(f"{CONFIG_MODULE}.py: {flavor.config} makes every linear layer but the output "
                     f"({float8.OUTPUT_FQN}) torchao Float8 ({float8.RECIPES[plan.precision]} recipe, "
                     "Float8LinearConverter in the model spec, which no command-line option reaches); torch.compile "
                     "stays off as for every export, so the casts run unfused (slower than torchtitan's compiled "
                     "Float8, the same memory: torchao saves the bf16 inputs); torchao must be installed")
    notes.append("CUDA graphs and torch.compile are off (training.disable_cuda_graphs, compile.no_enable): the "
                 "step runs eagerly, as parplan's memory model assumes; CUDA graphs cannot run pipeline "
                 "parallelism in 0.3.0")
    notes.append(f"the loss is the recipe's chunked cross entropy (the output layer and the loss run in "
                 f"{TORCHTITAN_LOSS_CHUNKS} sequence chunks inside forward), priced so by the torchtitan runtime")
    runtime = strategy.get("runtime")
    if runtime and runtime != "torchtitan":
        notes.append(f"the plan's memory was estimated for runtime {runtime}; plan with --target torchtitan for "
                     "torchtitan's buffers (runtime torchtitan: fp32 weights as the master copy, gradients freed "
                     "between steps)")
    if flavor.flavor == "405B" and plan.precision not in float8.RECIPES:
        notes.append(f"{CONFIG_MODULE}.py: torchtitan's llama3_405b recipe makes the linear layers but the output "
                     "Float8 (torchao) in its model spec, which no option undoes; this bf16 plan runs the "
                     f"{flavor.config} config written here (same model, learning rate and warm-up, no Float8); keep "
                     "the file next to the launch script")
    notes.append("not from the plan (the recipe's, override with extra options): data set, tokenizer path "
                 "(hf_assets_path), optimizer, learning-rate schedule, step count, checkpointing")
    return notes

"""Megatron-LM: the arguments of ``pretrain_gpt.py`` and a ``torchrun`` line per node.

Pinned to Megatron-LM ``core_v0.16.1`` (megatron-core 0.16.1). Most flags there are made from the
fields of megatron-core's ``TransformerConfig`` (``--`` + the field name with dashes; a boolean
that defaults to true gets ``--no-``/``--disable-`` or its own name in the field's metadata), the
batch sizes from ``megatron/training/training_config.py``, the data-parallel options from
megatron-core's ``DistributedDataParallelConfig`` (:data:`DDP_FLAGS`); the rest are declared by hand
in ``megatron/training/arguments.py`` (:data:`DECLARED_FLAGS`).

What is written: the model's sizes and kind (GPT: learned positions, LayerNorm, GELU, biases, tied
embeddings; Llama: RoPE, RMSNorm, SwiGLU, no biases, grouped-query attention; Mixtral: Llama with
experts; the architecture's own ``norm``, ``positions`` and ``linear_bias`` where it sets them), the
parallel degrees, the distributed optimizer (ZeRO-1; under hybrid sharding
``--num-distributed-optimizer-instances``), recomputation, the pipeline schedule and partition, the
batch sizes, and the communication overlap the plan was priced with:
``--overlap-grad-reduce`` whenever gradients are reduced over data-parallel ranks (parplan's megatron
runtime reduces each bucket under the backward; Megatron-LM does so only with that flag), and
``--overlap-param-gather`` / ``--tp-comm-overlap`` when the plan sets them. Data, tokenizer,
optimizer hyper-parameters and checkpointing are the user's: they are listed in the notes, not guessed.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from parplan.exports.common import (
    SIZES_HINT,
    Export,
    NotExpressible,
    PlanContext,
    UniformPlan,
    context_of,
    flag_lines,
    uniform_of,
)
from parplan.solver.cost import recompute_modules
from parplan.solver.cost.precision import PRECISIONS, TE_ADAM_BASES
from parplan.solver.frontends.config import (
    MEGATRON_NORMS,
    MEGATRON_POSITIONS,
    architecture_dropout,
    family_decoder,
)

MEGATRON_VERSION = "core_v0.16.1"
TARGET = "megatron"

#: Flags ``megatron/training/arguments.py`` declares itself at core_v0.16.1 (the others used here are
#: made from megatron-core's TransformerConfig and megatron.training's TrainingConfig fields).
DECLARED_FLAGS = frozenset({
    "--group-query-attention", "--swiglu", "--untie-embeddings-and-output-weights", "--position-embedding-type",
    "--max-position-embeddings", "--seq-length", "--num-experts",
    "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
    "--num-layers-per-virtual-pipeline-stage", "--use-flash-attn", "--vocab-size",
})
#: Flags made from megatron-core's DistributedDataParallelConfig fields (``--`` + the field with dashes).
#: parplan precision -> Megatron-LM's flags (``megatron/training/arguments.py``: with ``--bf16`` the
#: gradients are accumulated and reduced in fp32 unless ``--grad-reduce-in-bf16``; with ``--fp16``
#: only with ``--accumulate-allreduce-grads-in-fp32``); Transformer Engine's FP8 with ``--fp8-format
#: hybrid``, delayed scaling by default, ``--fp8-recipe tensorwise`` for current scaling, and
#: ``--fp8-param-gather`` for the ``-pg`` precisions (which assert the distributed optimizer)
_BASE_PRECISION_FLAGS: Mapping[str, tuple[str, ...]] = {
    "bf16": ("--bf16",), "bf16-grad16": ("--bf16", "--grad-reduce-in-bf16"),
    "fp16": ("--fp16", "--accumulate-allreduce-grads-in-fp32"), "fp16-grad16": ("--fp16",),
    **{f"fp8{cs}{pg}{g16}": ("--bf16", *(("--grad-reduce-in-bf16",) if g16 else ()), "--fp8-format", "hybrid",
                             *(("--fp8-recipe", "tensorwise") if cs else ()), *(("--fp8-param-gather",) if pg else ()))
       for cs in ("", "-cs") for pg in ("", "-pg") for g16 in ("", "-grad16")},
}
#: Transformer Engine FusedAdam's states (parplan's ``*-remainders`` precisions): Megatron-LM's
#: ``--use-precision-aware-optimizer`` hands the bf16 weights to TE's FusedAdam with ``master_weights`` and
#: ``store_param_remainders=OptimizerConfig.store_param_remainders`` (true, no flag turns it off:
#: ``megatron/core/optimizer/__init__.py``), the moments' dtypes from ``--exp-avg-dtype`` and
#: ``--exp-avg-sq-dtype``. A precision with bf16 moments but fp32 master weights has no flags.
PRECISION_FLAGS: Mapping[str, tuple[str, ...]] = {**_BASE_PRECISION_FLAGS, **{
    f"{base}-remainders{m}": (*_BASE_PRECISION_FLAGS[base], "--use-precision-aware-optimizer",
                              *(("--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16") if m else ()))
    for base in TE_ADAM_BASES for m in ("", "-moments-bf16")}}
DDP_FLAGS = frozenset({"--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
                       "--num-distributed-optimizer-instances"})
#: Flags made from megatron-core's OptimizerConfig fields: the hybrid CPU/GPU optimizer's and the
#: precision-aware optimizer's.
OPTIMIZER_FLAGS = frozenset({"--optimizer-cpu-offload", "--optimizer-offload-fraction",
                             "--use-precision-aware-optimizer", "--exp-avg-dtype", "--exp-avg-sq-dtype"})
#: Flags made from megatron.training's TrainingConfig (not shipped with megatron-core).
TRAINING_FLAGS = frozenset({"--micro-batch-size", "--global-batch-size"})


def megatron_arguments(plan: UniformPlan, ctx: PlanContext) -> list[str]:
    """The flags (each flag, then its value where it has one); NotExpressible with every reason
    the plan cannot be run by ``pretrain_gpt.py``."""
    arch = ctx.architecture
    if arch is None:
        raise NotExpressible(TARGET, ["the model is an operator graph without an architecture; Megatron-LM "
                                      f"builds its model from sizes ({SIZES_HINT})"])
    family = str(arch.get("family"))
    layers = int(arch.get("layers", 0))
    reasons = _model_reasons(plan, ctx, family, layers)
    partition = _partition_flags(plan, layers, reasons)
    reasons += _plan_reasons(plan, ctx, arch)
    if reasons:
        raise NotExpressible(TARGET, reasons)
    return [*_model_flags(arch, family, layers, ctx.seq_len), *_parallel_flags(plan, layers, partition),
            *_step_flags(plan)]


def _heads(arch: Mapping[str, Any]) -> tuple[int, int]:
    """(attention heads, key/value heads)."""
    return int(arch["heads"]), int(arch.get("kv_heads") or arch["heads"])


def _model_reasons(plan: UniformPlan, ctx: PlanContext, family: str, layers: int) -> list[str]:
    """Why ``pretrain_gpt.py`` cannot build the model or hold its optimizer states as planned."""
    reasons: list[str] = []
    if family not in ("gpt", "llama", "mixtral"):
        reasons.append(f"{ctx.model_name} is a {family} model; pretrain_gpt.py trains decoder-only GPT, Llama and "
                       "mixture-of-experts models")
    if plan.zero >= 2:
        reasons.append(f"ZeRO-{plan.zero}: Megatron-LM's distributed optimizer shards optimizer states (ZeRO-1); "
                       "its FSDP mode is not in parplan's megatron target")
    if plan.pp > layers:
        reasons.append(f"{plan.pp} pipeline stages for {layers} layers")
    return reasons


def _plan_reasons(plan: UniformPlan, ctx: PlanContext, arch: Mapping[str, Any]) -> list[str]:
    """Why Megatron-LM cannot run the plan's schedule, precision, context parallelism or overlap."""
    reasons: list[str] = []
    if plan.schedule in ("gpipe", "interleaved-zb", "zbv", "dualpipev"):
        name = "GPipe" if plan.schedule == "gpipe" else plan.schedule
        reasons.append(f"the {name} schedule (Megatron-LM runs 1F1B, interleaved when virtual stages are given)")
    if plan.recompute.startswith(recompute_modules.PREFIX):
        modules = recompute_modules.parse_modules(plan.recompute[len(recompute_modules.PREFIX):])
        if "moe_act" in modules and arch.get("family") != "mixtral":
            reasons.append("recompute module moe_act on a dense model: Megatron-LM's --moe-grouped-gemm it needs "
                           "is a mixture of experts' (plan without it)")
    if plan.recompute == "op":
        reasons.append("per-operator recomputation (op: PyTorch's selective checkpointing with torchtitan's policy); "
                       "Megatron-LM has none (plan with --target megatron)")
    prec = PRECISIONS.get(plan.precision)
    if prec is not None and prec.te_adam and not prec.param_remainders:
        reasons.append(f"precision {plan.precision}: Megatron-LM's precision-aware optimizer stores the fp32 master "
                       "as the bf16 weight and its remainder (OptimizerConfig.store_param_remainders, no flag): "
                       f"precision {prec.adam_base}-remainders-moments-bf16")
    elif prec is not None and prec.te_adam and plan.zero != 1:
        reasons.append(f"precision {plan.precision}: Megatron-LM's --use-precision-aware-optimizer needs the "
                       "distributed optimizer (ZeRO-1)")
    elif plan.precision not in PRECISION_FLAGS:
        reasons.append(f"precision {plan.precision}")
    elif "--fp8-param-gather" in PRECISION_FLAGS[plan.precision] and plan.zero != 1:
        reasons.append(f"precision {plan.precision}: Megatron-LM's --fp8-param-gather needs the distributed "
                       "optimizer (ZeRO-1)")
    if plan.cp > 1 and ctx.seq_len % (2 * plan.cp * (plan.tp if plan.sequence_parallel else 1)):
        each = ", each a multiple of tp with sequence parallelism" if plan.sequence_parallel else ""
        reasons.append(f"context parallelism cp={plan.cp}: Megatron-LM splits the sequence ({ctx.seq_len}) into "
                       f"2 x cp chunks{each}")
    heads, kv = _heads(arch)
    if plan.cp > 1 and plan.cp_comm == "a2a" and (heads % (plan.tp * plan.cp) or kv % (plan.tp * plan.cp)):
        reasons.append(f"the all-to-all context parallelism (--cp-comm-type a2a) splits the {heads} heads and {kv} "
                       f"key/value heads over tp x cp = {plan.tp * plan.cp}")
    if plan.overlap_param_gather and (plan.zero != 1 or plan.dp * plan.cp == 1):
        reasons.append("--overlap-param-gather: Megatron-LM overlaps the distributed optimizer's weight all-gather "
                       "(ZeRO-1 over more than one data-parallel rank)")
    if plan.dp_shard and (plan.zero != 1 or plan.dp % plan.dp_shard or plan.dp_shard % plan.expert_parallel):
        reasons.append(f"dp_shard {plan.dp_shard}: Megatron-LM shards within groups of the data-parallel ranks only "
                       "its distributed optimizer (ZeRO-1, --num-distributed-optimizer-instances dividing dp, the "
                       "expert-parallel ranks inside a group)")
    if plan.optimizer_offload and plan.zero != 1:
        reasons.append("--optimizer-cpu-offload: Megatron-LM offloads the distributed optimizer's shard (ZeRO-1; it "
                       "needs --use-precision-aware-optimizer, which needs --use-distributed-optimizer)")
    if plan.tp_comm_overlap and not (plan.sequence_parallel and plan.tp > 1):
        reasons.append("--tp-comm-overlap: Megatron-LM overlaps tensor-parallel communication only with sequence "
                       "parallelism")
    return reasons


def _model_flags(arch: Mapping[str, Any], family: str, layers: int, seq_len: int) -> list[str]:
    """The model's sizes and kind."""
    heads, kv = _heads(arch)
    head_dim = arch.get("head_dim")
    dropout = f"{architecture_dropout(arch):g}"
    args: list[str] = [
        "--num-layers", str(layers), "--hidden-size", str(arch["hidden"]), "--ffn-hidden-size", str(arch["ffn"]),
        "--num-attention-heads", str(heads), "--seq-length", str(seq_len),
        "--max-position-embeddings", str(max(seq_len, int(arch.get("seq_len") or 0))),
        "--vocab-size", str(arch["vocab"]),
        # Megatron-LM's dropouts default to 0.1, which parplan's Llama-style models do not have (their
        # masks would be memory the plan does not count): always the model's own
        "--hidden-dropout", dropout, "--attention-dropout", dropout,
    ]
    if head_dim:
        args += ["--kv-channels", str(head_dim)]
    own_norm, own_positions, own_bias = family_decoder(family)
    args += ["--position-embedding-type", MEGATRON_POSITIONS[arch.get("positions") or own_positions],
             "--normalization", MEGATRON_NORMS[arch.get("norm") or own_norm]]
    if family != "gpt":
        args.append("--swiglu")
    if not (own_bias if arch.get("linear_bias") is None else arch["linear_bias"]):
        args.append("--disable-bias-linear")
    if kv != heads:
        args += ["--group-query-attention", "--num-query-groups", str(kv)]
    if arch.get("qkv_bias"):
        args.append("--add-qkv-bias")  # biases on q, k, v (Qwen2), beside --disable-bias-linear
    if arch.get("qk_norm"):
        args.append("--qk-layernorm")  # the --normalization of q and k per head (Qwen3)
    if not arch.get("tied_embeddings", family == "gpt"):
        args.append("--untie-embeddings-and-output-weights")
    if family == "mixtral":
        args += ["--num-experts", str(arch["num_experts"]), "--moe-router-topk", str(arch.get("top_k", 2))]
    return args


def _parallel_flags(plan: UniformPlan, layers: int, partition: list[str]) -> list[str]:
    """The parallel degrees, the pipeline's partition, the distributed optimizer and the overlaps."""
    args = ["--tensor-model-parallel-size", str(plan.tp), "--pipeline-model-parallel-size", str(plan.pp)]
    if plan.sequence_parallel:
        args.append("--sequence-parallel")
    if plan.expert_parallel > 1:
        args += ["--expert-model-parallel-size", str(plan.expert_parallel)]
    if plan.expert_tensor_parallel is not None:
        args += ["--expert-tensor-parallel-size", str(plan.expert_tensor_parallel)]
    if plan.cp > 1:
        args += ["--context-parallel-size", str(plan.cp), "--cp-comm-type", plan.cp_comm]
    if plan.virtual_stages > 1:
        args += ["--num-layers-per-virtual-pipeline-stage", str(layers // (plan.pp * plan.virtual_stages))]
    args += partition
    if plan.zero == 1:
        args.append("--use-distributed-optimizer")
    if plan.replicate > 1:
        # the distributed optimizer sharded within dp / N consecutive data-parallel ranks, replicated
        # across N instances (megatron/core/parallel_state.py's intra-partial data-parallel groups)
        args += ["--num-distributed-optimizer-instances", str(plan.replicate)]
    if plan.dp * plan.cp > 1 and plan.overlap_grad_reduce:
        # parplan's megatron runtime prices the gradient reduction under the backward, bucket by
        # bucket, unless the plan says otherwise; Megatron-LM does that only with this flag
        # (without it, after the last backward)
        args.append("--overlap-grad-reduce")
    if plan.overlap_param_gather:
        args.append("--overlap-param-gather")
    if plan.tp_comm_overlap:
        args.append("--tp-comm-overlap")
    if plan.optimizer_offload:
        # the hybrid CPU/GPU optimizer (megatron/core/optimizer/cpu_offloading): Megatron-LM asserts the
        # precision-aware optimizer with it, which asserts the distributed optimizer
        args += ["--optimizer-cpu-offload", "--optimizer-offload-fraction", f"{plan.optimizer_offload:g}",
                 "--use-precision-aware-optimizer"]
    return args


def _step_flags(plan: UniformPlan) -> list[str]:
    """Recomputation, the batch sizes and the precision."""
    args: list[str] = []
    if plan.recompute == "selective":
        args += ["--recompute-granularity", "selective"]
    elif plan.recompute.startswith(recompute_modules.PREFIX):
        modules = recompute_modules.parse_modules(plan.recompute[len(recompute_modules.PREFIX):])
        args += ["--recompute-granularity", "selective", "--recompute-modules",
                 *(m for m in recompute_modules.MODULES if m in modules)]
        if "moe_act" in modules:  # Megatron-LM refuses moe_act without the grouped GEMM (transformer_config.py)
            args.append("--moe-grouped-gemm")
    elif plan.recompute == "full":
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    return [*args, "--micro-batch-size", str(plan.micro_batch), "--global-batch-size", str(plan.global_batch),
            *PRECISION_FLAGS[plan.precision], "--use-flash-attn"]


def _partition_flags(plan: UniformPlan, layers: int, reasons: list[str]) -> list[str]:
    """Megatron-LM splits layers evenly, but the first and last stage may hold other counts."""
    if plan.pp == 1:
        return []
    part = list(plan.partition or [])
    if not part:
        if layers % (plan.pp * plan.virtual_stages):
            reasons.append(f"{layers} layers do not split evenly over {plan.pp} stages x {plan.virtual_stages} "
                           "virtual stages")
        return []
    if sum(part) != layers or len(part) != plan.pp:
        reasons.append(f"partition {part} does not cover the {layers} layers in {plan.pp} stages")
        return []
    if len(set(part)) == 1:
        return []
    middle = part[1:-1]
    if len(set(middle)) > 1:
        reasons.append(f"partition {part}: Megatron-LM gives every stage but the first and last the same count")
        return []
    if plan.virtual_stages > 1:
        reasons.append(f"an uneven partition {part} with virtual stages")
        return []
    flags = []
    if not middle or part[0] != middle[0]:
        flags += ["--decoder-first-pipeline-num-layers", str(part[0])]
    if not middle or part[-1] != middle[0]:
        flags += ["--decoder-last-pipeline-num-layers", str(part[-1])]
    return flags


def export_megatron(doc: Mapping[str, Any]) -> Export:
    """The plan as Megatron-LM arguments (``megatron_args.txt``, one flag and its value per line)
    and a launch script running ``torchrun`` on every node."""
    plan = uniform_of(doc, TARGET)
    ctx = context_of(doc)
    args = megatron_arguments(plan, ctx)
    if plan.world != ctx.gpus:
        raise NotExpressible(TARGET, [f"{plan.degrees} devices, the cluster has {ctx.gpus}"])
    lines = flag_lines(args)
    launch = [_torchrun(ctx, node, args) for node in range(ctx.nodes)]
    summary = (doc.get("strategy") or {}).get("summary", "")
    script = "\n".join([
        "#!/usr/bin/env bash",
        f"# parplan plan for Megatron-LM {MEGATRON_VERSION}: {ctx.model_name} on {ctx.gpus} GPUs ({summary})",
        "# Run from a Megatron-LM checkout on every node with NODE_RANK, MASTER_ADDR and MASTER_PORT set;",
        "# add your data, tokenizer, optimizer and checkpoint flags in EXTRA_ARGS.",
        "set -euo pipefail",
        f"torchrun --nnodes {ctx.nodes} --nproc-per-node {ctx.procs_per_node} --node-rank \"${{NODE_RANK:-0}}\" "
        "--master-addr \"${MASTER_ADDR:-localhost}\" --master-port \"${MASTER_PORT:-29500}\" pretrain_gpt.py \\",
        "  " + " \\\n  ".join(lines) + " \\",
        "  ${EXTRA_ARGS:-}",
        "",
    ])
    notes = ["data (--data-path or --mock-data), tokenizer, optimizer (--lr ...), --train-iters and checkpoint "
             "flags are yours to add",
             "Megatron-LM pads the vocabulary to a multiple of 128 x tp (--make-vocab-size-divisible-by); the "
             "prediction prices the model's own vocabulary"]
    return Export(TARGET, MEGATRON_VERSION, {"megatron_args.txt": "\n".join(lines) + "\n",
                                             "launch_megatron.sh": script}, launch, notes)


def _torchrun(ctx: PlanContext, node: int, args: list[str]) -> str:
    return " ".join(["torchrun", "--nnodes", str(ctx.nodes), "--nproc-per-node", str(ctx.procs_per_node),
                     "--node-rank", str(node), "--master-addr", "$MASTER_ADDR", "--master-port", "$MASTER_PORT",
                     "pretrain_gpt.py", *(shlex.quote(a) for a in args)])

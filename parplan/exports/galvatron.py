"""Galvatron: the strategy file its trainers load (``--galvatron_config_path``) and a launch per node.

Pinned to Hetu-Galvatron 2.4.0 (PyPI ``hetu-galvatron==2.4.0``, the same files as the GitHub tag
``v2.4.0`` of PKU-DAIR/Hetu-Galvatron, commit 498bcad). The format, as that release reads it
(``galvatron/utils/config_utils.py: config2strategy`` and ``galvatron/core/runtime/
hybrid_parallel_config.py: get_hybrid_parallel_configs_api``) and as its search engine writes it:

- ``pp_deg``; per transformer block, in model order (T5: encoder blocks, then decoder blocks), as
  comma-separated integers: ``tp_sizes_enc`` (tensor-parallel degree; the data-parallel degree is
  ``gpus / pp_deg / tp``), ``tp_consecutive_flags`` (1: TP ranks are consecutive devices, 0: the
  DP ranks are), ``dp_types_enc`` (0: ``default_dp_type``, 1: sharded data parallelism, ZeRO-3 by
  FSDP's FULL_SHARD), ``use_sp`` (1: Ulysses sequence parallelism of that degree *instead of* TP)
  and ``checkpoint`` (1: the block is recomputed whole);
- ``global_bsz``, ``chunks`` (micro-batches per step), ``pp_division`` (blocks per stage),
  ``pipeline_type`` (``gpipe`` or ``pipedream_flush``, i.e. 1F1B), ``default_dp_type`` (``ddp`` or
  ``zero2``; one for the whole model), ``vtp``/``vsp``/``embed_sdp`` (one strategy shared by the
  embedding and the output head).

Megatron-style sequence parallelism is not in the file: it is the trainer's global
``--sequence-parallel`` flag, like ``--mixed_precision``, ``--use-flash-attn`` and
``--reduce_in_fp32`` (parplan's ``bf16``/``fp16`` reduce gradients in fp32, the ``*-grad16``
precisions in 16 bits, Galvatron's default).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from parplan.exports.common import (
    SIZES_HINT,
    Export,
    NotExpressible,
    PlanContext,
    context_of,
    expert_tensor_parallel_of,
    flag_lines,
    layered_strategy,
)

GALVATRON_VERSION = "2.4.0"
TARGET = "galvatron"
CONFIG_FILE = "galvatron_config.json"
SCRIPT_FILE = "train_galvatron.sh"

#: parplan model family -> Galvatron 2.4.0's model directory (``galvatron/models/<dir>``).
MODEL_DIRS: Mapping[str, str] = {"gpt": "gpt_hf", "llama": "llama_hf", "bert": "bert_hf", "t5": "T5", "vit": "vit_hf"}
#: parplan precision -> (Galvatron ``--mixed_precision``, gradients reduced in fp32).
PRECISIONS: Mapping[str, tuple[str, bool]] = {
    "bf16": ("bf16", True), "fp16": ("fp16", True), "fp32": ("fp32", False),
    "bf16-grad16": ("bf16", False), "fp16-grad16": ("fp16", False),
}
PIPELINE_TYPES: Mapping[str, str] = {"1f1b": "pipedream_flush", "gpipe": "gpipe"}
#: Galvatron 2.4.0's Llama meta configs (``llama_hf/meta_configs``) as (hidden, ffn, heads,
#: kv heads, vocab); a model of one of these shapes is built from the preset, the others from
#: ``--set_model_config_manually``, which cannot set the ffn size or the key/value heads.
LLAMA_PRESETS: Mapping[str, tuple[int, int, int, int, int]] = {
    "llama-0.3b": (1024, 2816, 16, 16, 32000), "llama-7b": (4096, 11008, 32, 32, 32000),
    "llama-13b": (5120, 13824, 40, 40, 32000), "llama-30b": (8192, 22016, 64, 8, 32000),
    "llama2-70b": (8192, 28672, 64, 8, 32000), "qwen2.5-7b": (3584, 18944, 28, 28, 152064),
    "qwen2.5-72b": (8192, 29568, 64, 8, 152064),
}


@dataclass(frozen=True)
class Block:
    """One transformer block's strategy inside its pipeline stage."""

    tp: int
    dp: int
    zero: int
    sequence_parallel: bool
    recompute: str
    tp_inner: bool
    expert_parallel: int
    stage: int | None = None  # as the document states it (per-layer documents)

    def describe(self) -> str:
        zero = {0: "", 3: " sdp"}.get(self.zero, f" zero{self.zero}")
        return f"tp{self.tp} dp{self.dp}{zero}"


@dataclass(frozen=True)
class Step:
    """What the plan sets once for the whole model."""

    pp: int
    num_microbatches: int
    global_batch: int
    partition: tuple[int, ...] | None
    schedule: str
    virtual_stages: int
    precision: str
    flash_attention: bool
    sync_every_microbatch: bool
    cp: int = 1
    dp_shard: int = 0  # hybrid sharding's shard group (0: none)


def export_galvatron(doc: Mapping[str, Any]) -> Export:
    """The plan as Galvatron 2.4.0's strategy file (``galvatron_config.json``) and a launch script;
    NotExpressible with every reason Galvatron cannot run it."""
    try:
        ctx = context_of(doc)
    except NotExpressible as e:
        raise NotExpressible(TARGET, e.reasons) from None
    blocks, step = _read_plan(doc, ctx)
    reasons: list[str] = []
    arch = ctx.architecture
    family = str(arch.get("family")) if arch is not None else ""
    if arch is None:
        reasons.append("the model is an operator graph without an architecture; Galvatron trains only its own "
                       f"model families, built from their sizes ({SIZES_HINT})")
    elif family not in MODEL_DIRS:
        why = " (Galvatron 2.4.0 has no mixture-of-experts model)" if family == "mixtral" else ""
        reasons.append(f"{ctx.model_name} is a {family} model; Galvatron {GALVATRON_VERSION} trains "
                       f"{', '.join(MODEL_DIRS)}{why}")
    partition = _check(blocks, step, ctx, reasons)
    if reasons:
        raise NotExpressible(TARGET, list(dict.fromkeys(reasons)))
    assert arch is not None
    config, notes = _config(blocks, step, partition)
    model_dir = MODEL_DIRS[family]
    model_args, model_notes = _model_arguments(family, arch, ctx, len(blocks))
    mixed, reduce_fp32 = PRECISIONS[step.precision]
    args = [*model_args, "--global_train_batch_size", str(step.global_batch), "--chunks", str(step.num_microbatches),
            "--mixed_precision", mixed]
    if any(b.sequence_parallel and b.tp > 1 for b in blocks):
        args.append("--sequence-parallel")
    if step.flash_attention:
        args.append("--use-flash-attn")
    if reduce_fp32:
        args.append("--reduce_in_fp32")
    if step.sync_every_microbatch:
        args.append("--no_async_grad_reduce")
    text = json.dumps(config, indent=4) + "\n"
    launch = [_launch_line(ctx, node, model_dir, args) for node in range(ctx.nodes)]
    script = _script(ctx, model_dir, args, str((doc.get("strategy") or {}).get("summary", "")))
    notes = [*notes, *model_notes,
             "the launch lines expect GALVATRON_HOME (a Hetu-Galvatron 2.4.0 checkout), PLAN_DIR (where these "
             "files are), MASTER_ADDR and MASTER_PORT; the script sets PLAN_DIR itself",
             "data, tokenizer, optimizer (--lr ...), --train-iters and checkpoint flags are yours to add "
             "(EXTRA_ARGS in the script); Megatron-style sequence parallelism, precision and flash attention "
             "are launch flags, not in the strategy file"]
    return Export(TARGET, GALVATRON_VERSION, {CONFIG_FILE: text, SCRIPT_FILE: script}, launch, notes)


def _read_plan(doc: Mapping[str, Any], ctx: PlanContext) -> tuple[list[Block], Step]:
    """Every block's strategy in model order, and the step settings."""
    s = layered_strategy(doc, TARGET, "Galvatron gives each transformer block one tensor/data-parallel layout")
    for run in [s, *(s.get("layers") or [])]:
        expert_tensor_parallel_of(run, TARGET)  # (refused: Galvatron splits the experts like the dense layers)
    kind = s.get("kind", "uniform")
    partition = tuple(int(n) for n in s["partition"]) if s.get("partition") else None
    step = Step(pp=int(s["pp"]), num_microbatches=int(s["num_microbatches"]), global_batch=int(s["global_batch"]),
                partition=partition, schedule=str(s.get("schedule", "1f1b")),
                virtual_stages=int(s.get("virtual_stages") or 1), precision=str(s.get("precision", "bf16")),
                flash_attention=bool(s.get("flash_attention", True)),
                sync_every_microbatch=bool(s.get("sync_every_microbatch", False)), cp=int(s.get("cp") or 1),
                dp_shard=max([int(s.get("dp_shard") or 0)]
                             + [int(r.get("dp_shard") or 0) for r in s.get("layers") or []]))
    if kind == "per-layer":
        blocks: list[Block] = []
        for run in s.get("layers") or []:
            stage = run.get("stage")
            b = Block(tp=int(run["tp"]), dp=int(run["dp"]), zero=int(run["zero"]),
                      sequence_parallel=bool(run["sequence_parallel"]), recompute=str(run["recompute"]),
                      tp_inner=bool(run.get("tp_inner", True)), expert_parallel=int(run.get("expert_parallel") or 1),
                      stage=None if stage is None else int(stage))
            blocks += [b] * int(run["count"])
        if not blocks:
            raise NotExpressible(TARGET, ["the per-layer plan has no layers"])
        return blocks, step
    if kind == "uniform":
        arch = ctx.architecture
        if arch is None:
            raise NotExpressible(TARGET, ["the model is an operator graph without an architecture, so its "
                                          "transformer blocks are unknown; Galvatron trains only its own model "
                                          "families"])
        count = int(arch.get("layers") or 0) + (int(arch.get("decoder_layers") or 0) if arch.get("family") == "t5"
                                                 else 0)
        b = Block(tp=int(s["tp"]), dp=int(s["dp"]), zero=int(s["zero"]),
                  sequence_parallel=bool(s["sequence_parallel"]), recompute=str(s["recompute"]),
                  tp_inner=bool(s.get("tp_inner", True)), expert_parallel=int(s.get("expert_parallel") or 1))
        return [b] * count, step
    raise NotExpressible(TARGET, [f"unknown strategy kind {kind!r}"])


def _check(blocks: list[Block], step: Step, ctx: PlanContext, reasons: list[str]) -> tuple[int, ...]:
    """Append every reason Galvatron cannot run the plan; the blocks per stage."""
    n = len(blocks)
    arch = ctx.architecture
    if arch is not None and arch.get("layers"):
        expected = int(arch["layers"]) + (int(arch.get("decoder_layers") or 0) if arch.get("family") == "t5" else 0)
        if n != expected:
            reasons.append(f"the plan's layers cover {n} blocks, the model has {expected}")
    if ctx.gpus > ctx.host_gpus and ctx.gpus % ctx.host_gpus:
        reasons.append(f"{ctx.gpus} GPUs are not whole nodes of {ctx.host_gpus}; Galvatron's launcher starts "
                       "the same number of processes on every node")
    pp = step.pp
    if pp < 1 or ctx.gpus % pp:
        reasons.append(f"pp {pp} does not divide the {ctx.gpus} GPUs")
    partition = step.partition or _stages_of(blocks, pp)
    if len(partition) != pp or sum(partition) != n or min(partition, default=0) < 1:
        reasons.append(f"partition {list(partition)} must give each of the {pp} stages at least one of the "
                       f"{n} blocks")
    else:
        stages = [s for s, count in enumerate(partition) for _ in range(count)]
        wrong = [i for i, (b, s) in enumerate(zip(blocks, stages, strict=True)) if b.stage not in (None, s)]
        if wrong:
            reasons.append(f"block {wrong[0]} is in stage {stages[wrong[0]]} by the partition {list(partition)} "
                           f"but its layer run says stage {blocks[wrong[0]].stage}")
    per_stage = ctx.gpus // pp if pp >= 1 else 0
    for b in dict.fromkeys(blocks):
        if b.tp * b.dp != per_stage:
            reasons.append(f"a block uses tp {b.tp} x dp {b.dp} devices; Galvatron gives every block all "
                           f"{per_stage} devices of its stage ({ctx.gpus} GPUs / pp {pp})")
        if step.global_batch % (step.num_microbatches * b.dp):
            reasons.append(f"global batch {step.global_batch} is not a multiple of {step.num_microbatches} "
                           f"micro-batches x dp {b.dp}")
    sharded = [b for b in blocks if b.dp > 1]
    if any(b.zero == 1 for b in sharded):
        reasons.append("ZeRO-1 (optimizer states sharded alone): Galvatron's data parallelism is ddp, zero2 "
                       "or sharded data parallelism (ZeRO-3)")
    if any(b.zero not in (0, 1, 2, 3) for b in blocks):
        reasons.append(f"unknown ZeRO stage(s) {sorted({b.zero for b in blocks} - {0, 1, 2, 3})}")
    if {b.zero for b in sharded} >= {0, 2}:
        reasons.append("some blocks use plain data parallelism and others ZeRO-2; Galvatron has one "
                       "default_dp_type (ddp or zero2) for every block that is not sharded (ZeRO-3)")
    if step.dp_shard:
        reasons.append(f"hybrid sharding (dp_shard {step.dp_shard}): Galvatron shards over each block's whole "
                       "data-parallel group")
    if step.cp > 1:
        reasons.append(f"context parallelism (cp={step.cp}): Galvatron {GALVATRON_VERSION} has no ring attention "
                       "(its per-block use_sp is Ulysses sequence parallelism in place of TP)")
    if any(b.expert_parallel > 1 for b in blocks):
        reasons.append(f"expert parallelism (degree {max(b.expert_parallel for b in blocks)}): Galvatron "
                       f"{GALVATRON_VERSION} has no mixture-of-experts layers")
    if len({b.sequence_parallel for b in blocks if b.tp > 1}) > 1:
        reasons.append("some tensor-parallel blocks use sequence parallelism and others not; Galvatron's "
                       "Megatron-style sequence parallelism is one switch (--sequence-parallel) for the whole model "
                       "(its per-block use_sp is Ulysses sequence parallelism in place of TP)")
    unknown = sorted({b.recompute for b in blocks} - {"none", "selective", "full"})
    if unknown:
        reasons.append(f"unknown recomputation {unknown}")
    if not step.flash_attention and any(b.recompute == "selective" for b in blocks):
        reasons.append("selective recomputation without flash attention: Galvatron recomputes a block whole "
                       "(checkpoint 1) or not at all")
    if step.schedule == "interleaved" or step.virtual_stages > 1:
        reasons.append("the interleaved pipeline schedule (virtual stages): Galvatron runs gpipe or "
                       "pipedream_flush (1F1B) with one stage per device")
    elif step.schedule not in PIPELINE_TYPES:
        reasons.append(f"unknown pipeline schedule {step.schedule!r}")
    if step.precision not in PRECISIONS:
        reasons.append(f"precision {step.precision} (Galvatron's --mixed_precision is fp32, fp16 or bf16)")
    return tuple(partition)


def _stages_of(blocks: list[Block], pp: int) -> tuple[int, ...]:
    """Blocks per stage when the document gives no partition: from the runs' stages, else even
    (parplan's even split: the remainder goes to the last stages)."""
    if pp >= 1 and blocks and all(b.stage is not None for b in blocks):
        return tuple(sum(1 for b in blocks if b.stage == s) for s in range(pp))
    if pp < 1:
        return ()
    base, extra = divmod(len(blocks), pp)
    return tuple(base + (1 if i >= pp - extra else 0) for i in range(pp))


def _config(blocks: list[Block], step: Step, partition: tuple[int, ...]) -> tuple[dict[str, Any], list[str]]:
    """The strategy file's keys (in the order Galvatron's search engine writes them), and notes."""
    notes: list[str] = []
    plain = {b.zero for b in blocks if b.dp > 1 and b.zero != 3}
    default_dp_type = "zero2" if plain == {2} else "ddp"
    first, last = blocks[0], blocks[-1]
    vtp = max(first.tp, last.tp)
    embed_sdp = int(any(b.zero == 3 and b.dp > 1 for b in (first, last)))
    shared = f"tp {vtp}" + (", sharded data parallelism" if embed_sdp else "")
    changed = [f"the {unit} (planned like the {which} block, {b.describe()})"
               for unit, which, b in (("embedding", "first", first), ("output head", "last", last))
               if b.tp != vtp or (b.zero == 3 and b.dp > 1) != bool(embed_sdp)]
    if changed:
        notes.append(f"Galvatron runs the embedding and the output head with one strategy (vtp, embed_sdp): "
                     f"{shared}; this differs from the plan for {' and '.join(changed)}, so their memory and time "
                     "differ a little from parplan's prediction")
    if any(b.recompute == "selective" for b in blocks):
        notes.append("blocks with selective recomputation run without checkpointing (checkpoint 0): with flash "
                     "attention there are no attention scores to recompute")
    config: dict[str, Any] = {
        "pp_deg": step.pp,
        "tp_sizes_enc": _join(b.tp for b in blocks),
        "tp_consecutive_flags": _join(0 if (b.tp > 1 and b.dp > 1 and not b.tp_inner) else 1 for b in blocks),
        "dp_types_enc": _join(1 if b.zero == 3 else 0 for b in blocks),
        "use_sp": _join(0 for _ in blocks),
        "checkpoint": _join(1 if b.recompute == "full" else 0 for b in blocks),
        "global_bsz": step.global_batch,
        "chunks": step.num_microbatches,
        "pp_division": _join(partition),
        "pipeline_type": PIPELINE_TYPES[step.schedule],
        "default_dp_type": default_dp_type,
        "vtp": vtp,
        "vsp": 0,
        "embed_sdp": embed_sdp,
    }
    return config, notes


def _join(values: Iterable[int]) -> str:
    return ",".join(str(int(v)) for v in values)


def _model_arguments(family: str, arch: Mapping[str, Any], ctx: PlanContext,
                     blocks: int) -> tuple[list[str], list[str]]:
    """The trainer's model flags, and notes for the sizes Galvatron builds differently."""
    hidden, heads, layers = int(arch["hidden"]), int(arch["heads"]), int(arch["layers"])
    ffn, vocab = int(arch["ffn"]), int(arch.get("vocab") or 0)
    kv = int(arch.get("kv_heads") or heads)
    diffs: list[str] = []
    if arch.get("head_dim") and int(arch["head_dim"]) != hidden // heads:
        diffs.append(f"head size {hidden // heads} (hidden / heads), the model's is {arch['head_dim']}")
    if family == "llama":
        preset = next((name for name, shape in LLAMA_PRESETS.items() if shape == (hidden, ffn, heads, kv, vocab)),
                      None)
        if preset is not None:
            args = ["--model_size", preset, "--set_layernum_manually", "1", "--num_hidden_layers", str(layers),
                    "--set_seqlen_manually", "1", "--seq_length", str(ctx.seq_len)]
            return args, _differs(diffs)
        if hidden * 8 // 3 != ffn:
            diffs.append(f"ffn {hidden * 8 // 3} (hidden x 8 / 3), the model's is {ffn}")
        if kv != heads:
            diffs.append(f"key/value heads: --set_model_config_manually keeps those of --model_size, the model has "
                         f"{kv}")
    elif family in ("gpt", "t5") and ffn != 4 * hidden:
        diffs.append(f"ffn {4 * hidden} (4 x hidden), the model's is {ffn}")
    elif family == "bert" and ffn != 3072:
        diffs.append(f"ffn 3072 (the bert_hf meta configs give no intermediate size), the model's is {ffn}")
    if family == "t5" and arch.get("gated_mlp"):
        diffs.append("a ReLU MLP (T5Config's default), the model's is gated-GELU")
    base = {"gpt": "gpt-0.3b", "llama": "llama-0.3b", "bert": "bert-base", "t5": "t5-small", "vit": "vit-base"}
    args = ["--model_size", base[family], "--set_model_config_manually", "1", "--hidden_size", str(hidden),
            "--num_attention_heads", str(heads)]
    if family == "t5":
        args += ["--num_encoder_layers", str(layers), "--num_decoder_layers", str(blocks - layers),
                 "--encoder_seq_length", str(ctx.seq_len), "--decoder_seq_length", str(ctx.seq_len),
                 "--vocab_size", str(vocab)]
    elif family == "vit":
        args += ["--num_hidden_layers", str(layers), "--intermediate_size", str(ffn),
                 "--image_size", str(arch.get("image_size", 224)), "--patch_size", str(arch.get("patch_size", 14)),
                 "--num_channels", str(arch.get("channels", 3)), "--num_labels", str(arch.get("num_classes", 1000))]
    else:
        args += ["--num_hidden_layers", str(layers), "--seq_length", str(ctx.seq_len), "--vocab_size", str(vocab)]
    notes = _differs(diffs)
    if family == "t5":
        notes.append(f"T5's decoder sequence is set to the encoder's ({ctx.seq_len})")
    return args, notes


def _differs(diffs: list[str]) -> list[str]:
    if not diffs:
        return []
    return ["the model Galvatron builds from these arguments differs from the planned one: " + "; ".join(diffs)
            + " (add a meta config for it to the model's meta_configs to train the planned shape)"]


def _launch_line(ctx: PlanContext, node: int, model_dir: str, args: list[str]) -> str:
    return " ".join([
        f'cd "$GALVATRON_HOME/galvatron/models/{model_dir}" &&', "python3 -m torch.distributed.launch",
        "--nnodes", str(ctx.nodes), "--nproc_per_node", str(ctx.procs_per_node), "--node_rank", str(node),
        "--master_addr", "$MASTER_ADDR", "--master_port", "$MASTER_PORT", "train_dist.py",
        *(shlex.quote(a) for a in args), "--galvatron_config_path", f'"$PLAN_DIR/{CONFIG_FILE}"'])


def _script(ctx: PlanContext, model_dir: str, args: list[str], summary: str) -> str:
    lines = flag_lines(args, shlex.quote)
    lines.append(f'--galvatron_config_path "$PLAN_DIR/{CONFIG_FILE}"')
    return "\n".join([
        "#!/usr/bin/env bash",
        f"# parplan plan for Galvatron {GALVATRON_VERSION}: {ctx.model_name} on {ctx.gpus} GPUs ({summary})",
        "# On every node: GALVATRON_HOME (a Hetu-Galvatron 2.4.0 checkout), NODE_RANK, MASTER_ADDR, MASTER_PORT;",
        "# add your data, tokenizer, optimizer and checkpoint flags in EXTRA_ARGS.",
        "set -euo pipefail",
        'PLAN_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"',
        f'cd "${{GALVATRON_HOME:?set GALVATRON_HOME to a Hetu-Galvatron checkout}}/galvatron/models/{model_dir}"',
        f"python3 -m torch.distributed.launch --nnodes {ctx.nodes} --nproc_per_node {ctx.procs_per_node} "
        '--node_rank "${NODE_RANK:-0}" --master_addr "${MASTER_ADDR:-localhost}" '
        '--master_port "${MASTER_PORT:-29500}" train_dist.py \\',
        "  " + " \\\n  ".join(lines) + " \\",
        "  ${EXTRA_ARGS:-}",
        "",
    ])

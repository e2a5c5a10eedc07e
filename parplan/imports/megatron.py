"""Megatron-LM arguments (``pretrain_gpt.py`` flags, as written by hand or by ``parplan export``).

The text may be one flag per line, a command line, or a ``torchrun ... pretrain_gpt.py ...`` line
(its ``--nnodes`` and ``--nproc-per-node`` then give the GPU count). The model comes from the size
flags (GPT: GELU MLP; Llama: ``--swiglu``; Mixtral: Llama with ``--num-experts``; each with the
``--normalization`` (LayerNorm or RMSNorm), ``--position-embedding-type`` (learned_absolute, rope or
none) and linear biases (unless ``--disable-bias-linear``) given, Megatron-LM's LayerNorm, learned
positions and biases when not; q/k/v biases with ``--add-qkv-bias`` and q/k norms with
``--qk-layernorm``; the dropouts from ``--hidden-dropout`` and ``--attention-dropout``, 0.1 when not
given, as Megatron-LM's defaults); ``--vocab-size`` is needed because Megatron-LM otherwise reads it
from the tokenizer. Flags for data, tokenizer, optimizer, logging and checkpoints do not change the
prediction and are listed in ``ignored``; a flag that changes memory or time and is not modelled is
an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from parplan.imports import megatron_moe as moe
from parplan.imports.common import Imported, ImportProblemError, refusals_as_problems
from parplan.imports.megatron_model import decoder, model_family, position_type
from parplan.imports.megatron_optimizer import precision_aware_states
from parplan.imports.megatron_pipeline import pipeline_split
from parplan.imports.shell import read_script
from parplan.solver.cost.activations import Recompute
from parplan.solver.frontends.config import TransformerConfig, dropout_field
from parplan.solver.models import ModelSource
from parplan.solver.strategy import CP_COMM, ParallelConfig, Schedule

KIND = "megatron-args"
#: Megatron-LM's ``--hidden-dropout`` and ``--attention-dropout`` when not given
MEGATRON_DROPOUT = 0.1
#: commands that start the training script (torchrun's and Python's)
_LAUNCHERS = ("torchrun", "python", "python3")

#: switches that change memory or time in ways parplan does not model (refused, naming what they do)
_REFUSED = (("--fp8-dot-product-attention", "FP8 attention"), ("--fp8-multi-head-attention", "FP8 attention"),
            ("--first-last-layers-bf16", "FP8 with the first and last layers in bf16"),
            ("--fp4-param-gather", "FP4 weights"), ("--cpu-offloading", "activation offloading"),
            ("--use-megatron-fsdp", "Megatron-FSDP's sharded data parallelism"),
            ("--use-torch-fsdp2", "PyTorch FSDP2 inside Megatron-LM"),
            # tensor_parallel/layers.py: the output layer's backward appends each micro-batch's logits gradient
            # (up to --wgrad-deferral-limit of them) to a buffer its weight gradient reads at the step's end
            ("--defer-embedding-wgrad-compute", "the output layer's logits gradients kept for a deferred weight "
             "gradient"))
#: flags that take a value (the others are switches)
_VALUED = {
    "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--num-query-groups",
    "--kv-channels", "--seq-length", "--max-position-embeddings", "--vocab-size", "--normalization",
    "--position-embedding-type", "--num-experts", "--moe-router-topk", "--tensor-model-parallel-size",
    "--pipeline-model-parallel-size", "--expert-model-parallel-size", "--num-layers-per-virtual-pipeline-stage",
    "--num-virtual-stages-per-pipeline-rank", "--microbatch-group-size-per-virtual-pipeline-stage",
    "--recompute-granularity", "--recompute-method", "--recompute-num-layers", "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers", "--micro-batch-size", "--global-batch-size", "--context-parallel-size",
    "--hidden-dropout", "--attention-dropout", "--make-vocab-size-divisible-by",
    "--expert-tensor-parallel-size", "--fp8-format", "--fp8-recipe", "--cp-comm-type", "--main-grads-dtype",
    "--main-params-dtype", "--exp-avg-dtype", "--exp-avg-sq-dtype", "--moe-token-dispatcher-type", "--optimizer",
    "--transformer-impl", "--attention-backend",
    "--num-distributed-optimizer-instances", "--optimizer-offload-fraction", *moe.VALUED,
}
#: flags that take a list of words (argparse ``nargs="*"``)
_LISTS = {"--recompute-modules"}
_SWITCHES = {"--swiglu", "--disable-bias-linear", "--group-query-attention", "--untie-embeddings-and-output-weights",
             "--sequence-parallel", "--use-distributed-optimizer", "--bf16", "--fp16", "--add-qkv-bias",
             "--qk-layernorm", "--tp-comm-overlap", "--overlap-param-gather", "--overlap-grad-reduce",
             "--grad-reduce-in-bf16", "--accumulate-allreduce-grads-in-fp32", "--fp8-param-gather",
             "--use-precision-aware-optimizer", "--moe-grouped-gemm", "--no-position-embedding",
             "--optimizer-cpu-offload", "--no-bias-swiglu-fusion", "--cross-entropy-loss-fusion",
             "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
             "--use-rotary-position-embeddings", *(f for f, _ in _REFUSED), *moe.SWITCHES, *(f for f, _ in moe.REFUSED)}
#: known flags that do not change memory or time as parplan prices them (with a value, or a switch)
_IGNORED_VALUED = {
    "--data-path", "--split", "--tokenizer-type", "--tokenizer-model", "--vocab-file", "--merge-file", "--lr",
    "--min-lr", "--lr-decay-style", "--lr-decay-iters", "--lr-warmup-iters", "--lr-warmup-fraction",
    "--weight-decay", "--clip-grad", "--adam-beta1", "--adam-beta2", "--adam-eps", "--init-method-std",
    "--train-iters", "--train-samples", "--save", "--load", "--save-interval", "--log-interval", "--eval-iters",
    "--eval-interval", "--seed", "--norm-epsilon", "--rotary-base", "--rotary-percent",
    "--tensorboard-dir", "--distributed-backend", "--ckpt-format",
    "--distributed-timeout-minutes", "--num-workers", "--exit-duration-in-mins", "--wandb-project", "--wandb-exp-name",
    "--lr-decay-samples", "--lr-warmup-samples", "--decoupled-lr", "--decoupled-min-lr", "--data-cache-path",
    "--tiktoken-pattern", "--profile-step-start", "--profile-step-end", "--moe-aux-loss-coeff",
    # the caching allocator's release of unused blocks: what is reserved, not what tensors hold
    "--empty-unused-memory-level",
    # how many logits gradients --defer-embedding-wgrad-compute keeps (refused)
    "--wgrad-deferral-limit",
    # Transformer Engine's amax history and margin: the scaling state, far below what the FP8 model over-counts
    "--fp8-amax-history-len", "--fp8-amax-compute-algo", "--fp8-margin", "--fp8-interval",
    # the router's auxiliary loss: a few reductions over the router's logits
    "--moe-router-load-balancing-type", *moe.IGNORED_VALUED,
}
_IGNORED_SWITCHES = {"--mock-data", "--no-masked-softmax-fusion", "--use-mcore-models", "--no-load-optim",
                     "--no-load-rng", "--log-throughput", "--no-bias-gelu-fusion",
                     "--no-bias-dropout-fusion", "--no-rope-fusion", "--use-flash-attn", "--apply-layernorm-1p",
                     "--calculate-per-token-loss", "--manual-gc", "--profile", "--no-mmap-bin-files",
                     "--no-create-attention-mask-in-dataloader", *moe.IGNORED_SWITCHES}


@dataclass(frozen=True)
class _Launch:
    """The training script's words, and what the launch line says of the GPUs."""

    words: list[str]
    nodes: int | None
    procs: int | None
    notes: list[str]
    unresolved: dict[str, str]  # variable -> why the script's value is not known


def _launch(text: str) -> _Launch:
    """The flags after the training script of the script's launch command (or every flag line), with
    torchrun's nodes and processes per node (its defaults, 1 and 1, when it leaves them out)."""
    script = read_script(text)
    command = next((c[i:] for c in script.commands for i, w in enumerate(c)
                    if w.rsplit("/", 1)[-1] in _LAUNCHERS), None)  # after a prefix such as `uv run`
    if command is None:
        return _Launch([w for c in script.commands if c[0].startswith("-") for w in c], None, None, [],
                       script.unresolved)
    at = next((i for i, w in enumerate(command) if w.endswith(".py")), None)
    if at is None:
        raise ImportProblemError(KIND, [f"the launch line `{' '.join(command[:6])} ...` names no training script"])
    launcher, words = command[:at], command[at + 1:]
    if command[at].rsplit("/", 1)[-1] != "pretrain_gpt.py":
        raise ImportProblemError(KIND, [f"the training script {command[at]}: parplan reads the arguments of "
                                        "pretrain_gpt.py (GPT, Llama and Mixtral models)"])
    used = {name: value for name, value in script.defaults.items() if value}
    notes = ["variables the script leaves to its caller, their defaults used: "
             + ", ".join(f"{name}={value}" for name, value in used.items())] if used else []
    if launcher[0].rsplit("/", 1)[-1] != "torchrun" and "torch.distributed.run" not in launcher:
        return _Launch(words, None, None, notes, script.unresolved)
    opts = _launcher_options(launcher[1:])
    nodes, procs = opts.get("--nnodes"), opts.get("--nproc-per-node")
    for flag, value in (("--nnodes", nodes), ("--nproc-per-node", procs)):
        if value is None:
            notes.append(f"torchrun without {flag}: its default 1")
    return _Launch(words, _int(nodes or "1", "--nnodes"), _int(procs or "1", "--nproc-per-node"), notes,
                   script.unresolved)


def _launcher_options(words: list[str]) -> dict[str, str]:
    """torchrun's ``--nnodes`` and ``--nproc-per-node`` (either spelling, ``=`` or a separate value)."""
    out: dict[str, str] = {}
    for i, w in enumerate(words):
        name, eq, inline = w.partition("=")
        name = name.replace("_", "-")
        if name in ("--nnodes", "--nproc-per-node"):
            value = inline if eq else (words[i + 1] if i + 1 < len(words) else "")
            if name == "--nnodes" and ":" in value:
                raise ImportProblemError(KIND, [f"torchrun --nnodes {value}: an elastic range of nodes; give one "
                                                "count"])
            out[name] = value
    return out


def _int(text: str, flag: str) -> int:
    if text.startswith("$"):
        raise ImportProblemError(KIND, [f"{flag} {text}: the variable is not set to a plain value in the script"])
    try:
        value = int(text)
    except ValueError:
        raise ImportProblemError(KIND, [f"{flag} {text!r} is not an integer"]) from None
    if value < 1:
        raise ImportProblemError(KIND, [f"{flag} must be at least 1, got {value}"])
    return value


def read_megatron_args(text: str, gpus: int | None = None) -> Imported:
    """The model, strategy and batch of Megatron-LM arguments: a flag file, a command line or a
    launch script. The GPU count is ``gpus`` when given (it overrides a torchrun line's, said in
    ``adjusted``), else the torchrun line's."""
    launch = _launch(text)
    flags, unknown, ignored = _flags(launch.words, launch.unresolved)
    adjusted = list(launch.notes)
    world = launch.nodes * launch.procs if launch.nodes and launch.procs else None
    if gpus is not None and world is not None and gpus != world:
        adjusted.append(f"--gpus {gpus} overrides the launch line's {world} processes "
                        f"({launch.nodes} node(s) x {launch.procs})")
    world = gpus if gpus is not None else world
    if world is None:
        raise ImportProblemError(KIND, ["the GPU count: give --gpus (the arguments have no torchrun line)"])
    return _imported(flags, world, launch.procs, unknown, ignored, adjusted)


def _flags(words: list[str], unresolved: dict[str, str]) -> tuple[dict[str, str | bool], list[str], list[str]]:
    """(the flags parplan reads, unknown words, ignored flags); a word that is a variable the script
    does not set (``unresolved``: why) is refused, naming it."""
    flags: dict[str, str | bool] = {}
    unknown: list[str] = []
    ignored: list[str] = []
    i = 0
    while i < len(words):
        w = words[i]
        name, eq, inline = w.partition("=")
        if w.startswith("$"):  # a variable the script does not set: its flags are unknown
            why = unresolved.get(w.lstrip("${").rstrip("}"), "not set to a plain value in the script")
            raise ImportProblemError(KIND, [f"{w}: {why}, so the flags it holds are unknown"])
        if not name.startswith("--"):
            unknown.append(w)
            i += 1
            continue
        takes = name in _VALUED or name in _IGNORED_VALUED
        value: str | bool = True
        if name in _LISTS and not eq:  # nargs="*": the words up to the next flag
            j = i + 1
            while j < len(words) and not words[j].startswith(("--", "$")):
                j += 1
            flags[name] = " ".join(words[i + 1:j])
            i = j
            continue
        if eq:
            value = inline
        elif takes or (name not in _SWITCHES and name not in _IGNORED_SWITCHES and i + 1 < len(words)
                       and not words[i + 1].startswith(("--", "$"))):
            if i + 1 >= len(words):
                raise ImportProblemError(KIND, [f"{name} needs a value"])
            value = words[i + 1]
            i += 1
        i += 1
        if name in _VALUED or name in _SWITCHES or name in _LISTS:
            flags[name] = value.replace(",", " ") if name in _LISTS and isinstance(value, str) else value
        elif name in _IGNORED_VALUED or name in _IGNORED_SWITCHES:
            ignored.append(name)
        else:
            unknown.append(name if value is True else f"{name} {value}")
    return flags, unknown, ignored


def _get(flags: dict[str, str | bool], name: str, default: int | None = None) -> int | None:
    v = flags.get(name)
    if v is None:
        return default
    if v is True:
        raise ImportProblemError(KIND, [f"{name} needs a value"])
    return _int(str(v), name)


def _imported(flags: dict[str, str | bool], world: int, per_node: int | None, unknown: list[str],
              ignored: list[str], adjusted: list[str]) -> Imported:
    _require(flags)
    problems = [f"{f} ({why}) is not modelled" for f, why in _REFUSED if f in flags]
    if str(flags.get("--optimizer", "adam")) != "adam":
        problems.append(f"--optimizer {flags['--optimizer']}: parplan prices Adam's states")
    unpriced: list[str] = []
    cp_comm = str(flags.get("--cp-comm-type", "p2p"))
    if (_get(flags, "--context-parallel-size", 1) or 1) > 1 and cp_comm not in CP_COMM:
        problems.append(f"context parallelism with --cp-comm-type {cp_comm}: parplan prices the p2p ring and "
                        "the all-to-all (a2a)")
    ept = _get(flags, "--expert-tensor-parallel-size")
    tp = _get(flags, "--tensor-model-parallel-size", 1) or 1
    if ept is not None and ept != tp and not flags.get("--num-experts"):
        # megatron/core/parallel_state.py: it only sizes the expert groups, which a dense model has none of
        adjusted.append(f"--expert-tensor-parallel-size {ept} without --num-experts: no expert layers to split")
        ept = None
    pp, cp = _get(flags, "--pipeline-model-parallel-size", 1) or 1, _get(flags, "--context-parallel-size", 1) or 1
    problems += moe.refusals(flags, world // (tp * pp * cp) or 1, cp, tp, ept or tp)
    group = _get(flags, "--microbatch-group-size-per-virtual-pipeline-stage")
    if group is not None and group != pp:
        # pipeline_parallel/schedules.py (get_pp_rank_microbatches): the interleaved warm-up runs (v - 1) x group
        # chunk-forwards, not the (v - 1) x pp of its default
        problems.append(f"--microbatch-group-size-per-virtual-pipeline-stage {group} (other than the pipeline size "
                        f"{pp}: a longer interleaved warm-up) is not modelled")
    family = model_family(flags, problems)
    recompute = _recompute(flags, problems)
    precision = _precision(flags, problems, adjusted)
    ignored += _read_but_inert(flags, problems, adjusted)
    if tp == 1 and "--sequence-parallel" in flags:
        adjusted.append("--sequence-parallel with tensor-parallel size 1: Megatron-LM turns it off (\"Disabling "
                        "sequence parallelism because tensor model parallelism is disabled\")")
        del flags["--sequence-parallel"]
    if problems:
        raise ImportProblemError(KIND, problems)
    assert recompute is not None
    with refusals_as_problems(KIND):
        cfg, seq = _config(flags, family, adjusted)
        strategy = _strategy(flags, world, cfg.layers, (tp, ept), recompute, cp_comm, precision, adjusted)
    unpriced += moe.notes(flags, strategy.expert_parallel) + _padding_note(flags, cfg.vocab, tp)
    if "--cross-entropy-loss-fusion" in flags:
        # megatron/core/fusions/fused_cross_entropy.py, its in-place steps under torch.compile (core/jit.py)
        unpriced.append("--cross-entropy-loss-fusion is priced as the unfused loss; Megatron-LM's CI measures about "
                        "one more fp32 logits-sized buffer on the last stage with it")
    return Imported(KIND, ModelSource(cfg.name, config=cfg), strategy, seq, world, per_node, "megatron", unknown,
                    ignored, unpriced, adjusted)


def _read_but_inert(flags: dict[str, str | bool], problems: list[str], adjusted: list[str]) -> list[str]:
    """Known flags that change nothing priced in this configuration (Megatron-LM reads them only with
    another setting), taken out of ``flags``; ``problems`` gets those that would change the model."""
    inert = []
    if "--no-position-embedding" in flags:
        if position_type(flags) != "rope":
            # megatron/training/arguments.py (validate_args)
            problems.append("--no-position-embedding without --position-embedding-type rope: Megatron-LM refuses it "
                            "(\"--no-position-embedding is deprecated, use --position-embedding-type\")")
        inert.append("--no-position-embedding")
    if "--grad-reduce-in-bf16" in flags and "--bf16" not in flags:
        adjusted.append("--grad-reduce-in-bf16 without --bf16: Megatron-LM reads it with --bf16 only")
        inert.append("--grad-reduce-in-bf16")
    if "--fp8-recipe" in flags and "--fp8-format" not in flags:
        inert.append("--fp8-recipe")
    if "--no-bias-swiglu-fusion" in flags:
        if "--swiglu" in flags:  # Runtime.fuses_gated_activation: the megatron runtime prices the fused SwiGLU
            problems.append("--no-bias-swiglu-fusion (the unfused SwiGLU, which keeps the SiLU output for "
                            "backward too) is not modelled")
        inert.append("--no-bias-swiglu-fusion")
    if "--accumulate-allreduce-grads-in-fp32" in flags and "--fp16" not in flags:
        inert.append("--accumulate-allreduce-grads-in-fp32")  # fp32 is bf16's default
    for flag in inert:
        if flag != "--accumulate-allreduce-grads-in-fp32":
            flags.pop(flag, None)
    return inert


def _precision(flags: dict[str, str | bool], problems: list[str], adjusted: list[str]) -> str:
    """parplan's precision for Megatron-LM's mixed-precision flags (``megatron/training/arguments.py``:
    with ``--bf16``, ``--grad-reduce-in-bf16`` sets ``accumulate_allreduce_grads_in_fp32 = False``, else
    it is turned on; with ``--fp16`` it stays off unless given; the DDP's gradient buffers take
    ``grad_reduce_in_fp32`` from it), with the precision-aware optimizer's states
    (:func:`~parplan.imports.megatron_optimizer.precision_aware_states`)."""
    if "--fp16" in flags and "--bf16" in flags:
        problems.append("both --fp16 and --bf16")
    grads16 = ("--grad-reduce-in-bf16" in flags or str(flags.get("--main-grads-dtype", "fp32")) == "bf16")
    if "--bf16" in flags:
        base = "bf16"
        if grads16:
            adjusted.append("--grad-reduce-in-bf16: Megatron-LM accumulates and reduces the gradients in bf16 "
                            "(accumulate_allreduce_grads_in_fp32 off): precision bf16-grad16")
    elif "--fp16" in flags:
        base, grads16 = "fp16", "--accumulate-allreduce-grads-in-fp32" not in flags
        if grads16:
            adjusted.append("--fp16 without --accumulate-allreduce-grads-in-fp32: Megatron-LM accumulates and "
                            "reduces the gradients in fp16: precision fp16-grad16")
    else:
        base, grads16 = "fp32", False
    if "--fp8-format" not in flags:
        if "--fp8-param-gather" in flags:
            problems.append("--fp8-param-gather without --fp8-format")
        name = base + ("-grad16" if grads16 else "")
    else:
        name = _fp8(flags, base, grads16, problems, adjusted)
    return precision_aware_states(flags, name, problems, adjusted)


def _fp8(flags: dict[str, str | bool], base: str, grads16: bool, problems: list[str], adjusted: list[str]) -> str:
    """Transformer Engine's FP8 (``--fp8-format``), priced with parplan's FP8 model."""
    fmt, recipe = str(flags["--fp8-format"]), str(flags.get("--fp8-recipe", "delayed"))
    name = {"delayed": "fp8", "tensorwise": "fp8-cs"}.get(recipe)
    if base != "bf16":
        problems.append(f"--fp8-format with {base} weights: parplan's FP8 model keeps bf16 weights (give --bf16)")
    if fmt not in ("e4m3", "hybrid"):
        problems.append(f"--fp8-format {fmt}: Megatron-LM's formats are e4m3 and hybrid")
    if name is None:
        problems.append(f"--fp8-recipe {recipe}: parplan prices the delayed and tensorwise (current) scaling recipes")
        return "fp8"
    if "--fp8-param-gather" in flags:
        name += "-pg"
        adjusted.append(f"--fp8-param-gather: Megatron-LM keeps the FP8 GEMMs' weights in FP8 only and gathers "
                        f"them in FP8: precision {name}{'-grad16' if grads16 else ''}")
    return name + ("-grad16" if grads16 else "")


def _padding_note(flags: dict[str, str | bool], vocab: int, tp: int) -> list[str]:
    """Megatron-LM pads the vocabulary to a multiple of ``--make-vocab-size-divisible-by`` (128) x tp
    (``_vocab_size_with_padding``); the prediction prices the vocabulary given."""
    multiple = (_get(flags, "--make-vocab-size-divisible-by", 128) or 128) * tp
    padded = -(-vocab // multiple) * multiple
    if padded == vocab:
        return []
    return [f"Megatron-LM pads the vocabulary {vocab} to {padded} (a multiple of {multiple}): the {padded - vocab} "
            "padded rows of the embedding and output layer are not priced"]


def _require(flags: dict[str, str | bool]) -> None:
    """The flags without which the model or the batch is unknown."""
    missing = [f for f in ("--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length",
                           "--micro-batch-size") if f not in flags]
    if "--vocab-size" not in flags:
        missing.append("--vocab-size (Megatron-LM reads it from the tokenizer; give it here)")
    if missing:
        raise ImportProblemError(KIND, [f"missing {', '.join(missing)}"])


def _recompute(flags: dict[str, str | bool], problems: list[str]) -> Recompute | None:
    """The recomputation ``--recompute-*`` ask for; None (and a problem) when parplan does not model it."""
    granularity = str(flags.get("--recompute-granularity", "none"))
    recompute = {"none": Recompute.NONE, "selective": Recompute.SELECTIVE, "full": Recompute.FULL}.get(granularity)
    if recompute is None:
        problems.append(f"--recompute-granularity {granularity}")
    elif recompute is Recompute.SELECTIVE:
        return _recompute_modules(flags, problems)
    elif recompute is Recompute.FULL:
        method = str(flags.get("--recompute-method", ""))
        per = _get(flags, "--recompute-num-layers", 1)
        if method != "uniform" or per != 1:
            problems.append("full recomputation is modelled for every layer (--recompute-method uniform "
                            f"--recompute-num-layers 1; got {method or 'no method'}, {per})")
    return recompute


def _recompute_modules(flags: dict[str, str | bool], problems: list[str]) -> Recompute | None:
    """Selective recomputation of ``--recompute-modules`` (Megatron-LM's default: ``core_attn``), as
    :mod:`~parplan.solver.cost.recompute_modules` prices it; None (and a problem) where Megatron-LM
    refuses the set or parplan does not price it."""
    listed = flags.get("--recompute-modules")
    try:
        recompute = Recompute.of_modules(str(listed).split() if isinstance(listed, str) else ["core_attn"])
    except ValueError as e:
        problems.append(f"--recompute-modules: {e}")
        return None
    modules = recompute.modules
    if "moe_act" in modules and "--moe-grouped-gemm" not in flags:
        problems.append("--recompute-modules moe_act without --moe-grouped-gemm: Megatron-LM refuses it "
                        "(\"moe_act in recompute_modules is only supported with moe_grouped_gemm\")")
    if "layernorm" in modules and str(flags.get("--transformer-impl", "transformer_engine")) == "local":
        problems.append("--recompute-modules layernorm with --transformer-impl local (the input and pre-MLP norms "
                        "modules of their own) is not modelled: parplan prices Transformer Engine's layer spec")
    if "mlp" in modules and str(flags.get("--transformer-impl", "transformer_engine")) == "local":
        problems.append("--recompute-modules mlp with --transformer-impl local (the pre-MLP norm outside the MLP) is "
                        "not modelled: parplan prices Transformer Engine's layer spec")
    if "shared_experts" in modules and "--moe-shared-expert-overlap" in flags:
        problems.append("--recompute-modules shared_experts with --moe-shared-expert-overlap: Megatron-LM refuses it")
    return recompute


def _config(flags: dict[str, str | bool], family: Literal["gpt", "llama", "mixtral"],
            adjusted: list[str]) -> tuple[TransformerConfig, int]:
    """(the model the size flags describe, ``--seq-length``); Megatron-LM's defaults for the size
    flags left out (``megatron/training/arguments.py``, ``TransformerConfig``) are said in ``adjusted``."""
    layers = _get(flags, "--num-layers")
    hidden, heads = _get(flags, "--hidden-size"), _get(flags, "--num-attention-heads")
    seq, vocab = _get(flags, "--seq-length"), _get(flags, "--vocab-size")
    assert layers and hidden and heads and seq and vocab
    # a GPT's learned position table has --max-position-embeddings rows (parplan's config seq_len)
    positions = max(seq, _get(flags, "--max-position-embeddings", seq) or seq)
    kv = None
    if "--group-query-attention" in flags:
        kv = _get(flags, "--num-query-groups", 1)
        if "--num-query-groups" not in flags:
            adjusted.append("--group-query-attention without --num-query-groups: Megatron-LM's default, 1 group")
    ffn = _get(flags, "--ffn-hidden-size")
    if ffn is None:
        # Megatron-LM: with --swiglu, int((4 * hidden * 2 / 3) / 64) * 64, else 4 * hidden
        ffn = int((4 * hidden * 2 / 3) / 64) * 64 if "--swiglu" in flags else 4 * hidden
        adjusted.append(f"no --ffn-hidden-size: Megatron-LM's default, {ffn}")
    # Megatron-LM's dropouts default to 0.1. parplan's model has one probability for both; a dropout
    # keeps its mask whatever the probability, so the larger stands for both (a mask more, never one
    # less, when they differ)
    dropout = max(_probability(flags, "--hidden-dropout"), _probability(flags, "--attention-dropout"))
    missing = [f for f in ("--hidden-dropout", "--attention-dropout") if f not in flags]
    if missing:
        adjusted.append(f"no {' or '.join(missing)}: Megatron-LM's default, {MEGATRON_DROPOUT}")
    problems: list[str] = []
    experts = moe.expert_fields(flags, layers, ffn, problems, adjusted)
    if problems:
        raise ImportProblemError(KIND, problems)
    cfg = TransformerConfig(
        family=family, name="megatron-args", layers=layers, hidden=hidden, heads=heads,
        ffn=experts.pop("ffn", ffn), vocab=vocab, seq_len=positions, kv_heads=kv,
        head_dim=_get(flags, "--kv-channels"), tied_embeddings="--untie-embeddings-and-output-weights" not in flags,
        qkv_bias="--add-qkv-bias" in flags, qk_norm="--qk-layernorm" in flags,
        dropout=dropout_field(family, dropout), **decoder(flags, family), **experts)
    return cfg, seq


def _strategy(flags: dict[str, str | bool], world: int, layers: int, tensor: tuple[int, int | None],
              recompute: Recompute, cp_comm: str, precision: str, adjusted: list[str]) -> ParallelConfig:
    """The degrees, batch, pipeline and overlaps the flags give on ``world`` GPUs; ``tensor``: the
    tensor-parallel size and the experts' own (``--expert-tensor-parallel-size``, None: the same)."""
    tp, etp = tensor
    pp = _get(flags, "--pipeline-model-parallel-size", 1) or 1
    cp = _get(flags, "--context-parallel-size", 1) or 1
    if world % (tp * pp * cp):
        what = "tp x pp x cp" if cp > 1 else "tp x pp"
        raise ImportProblemError(KIND, [f"{what} = {tp * pp * cp} does not divide the {world} GPUs"])
    dp = world // (tp * pp * cp)
    mb = _get(flags, "--micro-batch-size") or 1
    gb = _get(flags, "--global-batch-size", mb * dp) or mb * dp
    if "--global-batch-size" not in flags:
        adjusted.append(f"no --global-batch-size: Megatron-LM's default, micro-batch x data-parallel size = {gb}")
    if gb % (mb * dp):
        raise ImportProblemError(KIND, [f"--global-batch-size {gb} is not a multiple of --micro-batch-size {mb} x "
                                        f"data-parallel size {dp}"])
    problems: list[str] = []
    split = pipeline_split(layers, pp, _get(flags, "--decoder-first-pipeline-num-layers"),
                           _get(flags, "--decoder-last-pipeline-num-layers"),
                           "--account-for-embedding-in-pipeline-split" in flags,
                           "--account-for-loss-in-pipeline-split" in flags,
                           _get(flags, "--num-layers-per-virtual-pipeline-stage"),
                           _get(flags, "--num-virtual-stages-per-pipeline-rank"), problems)
    if problems:
        raise ImportProblemError(KIND, problems)
    virtual, partition = split.virtual, split.partition
    return ParallelConfig(
        tp=tp, pp=pp, dp=dp, zero=1 if "--use-distributed-optimizer" in flags else 0,
        dp_shard=_shard_group(flags, dp, cp),
        sequence_parallel="--sequence-parallel" in flags, recompute=recompute, micro_batch=mb,
        num_microbatches=gb // (mb * dp),
        schedule=Schedule.INTERLEAVED if virtual > 1 else Schedule.ONE_F_ONE_B, virtual_stages=virtual,
        precision=precision,
        expert_parallel=_get(flags, "--expert-model-parallel-size", 1) or 1, expert_tensor_parallel=etp,
        partition=partition, cp=cp,
        cp_comm=cp_comm if cp > 1 else "p2p", tp_comm_overlap="--tp-comm-overlap" in flags,
        overlap_param_gather="--overlap-param-gather" in flags,
        overlap_grad_reduce="--overlap-grad-reduce" in flags or dp * cp == 1,
        optimizer_offload=_offload_fraction(flags), flash_attention=_flash_attention(flags))


def _flash_attention(flags: dict[str, str | bool]) -> bool:
    """Whether the attention core is a flash kernel (no score matrix kept for backward). Megatron-LM's
    local layers run its own ``DotProductAttention``, which materialises the scores
    (``megatron/core/models/backends.py``: ``LocalSpecProvider.core_attention``); so does
    ``--attention-backend local`` (which needs the local spec) and ``unfused``, which leaves Transformer
    Engine only its ``UnfusedDotProductAttention`` (``language_module.py``: ``_set_attention_backend``
    sets NVTE_UNFUSED_ATTN=1, the flash and fused ones 0). ``flash``, ``fused`` and ``auto`` run a flash
    kernel."""
    return (str(flags.get("--transformer-impl", "transformer_engine")) != "local"
            and str(flags.get("--attention-backend", "auto")) not in ("unfused", "local"))


def _offload_fraction(flags: dict[str, str | bool]) -> float:
    """``--optimizer-offload-fraction`` under ``--optimizer-cpu-offload`` (Megatron-LM's default fraction 0
    without it: ``OptimizerConfig.optimizer_offload_fraction``); the precision-aware optimizer it asserts
    must be given too (``megatron/training/arguments.py``)."""
    if "--optimizer-cpu-offload" not in flags:
        return 0.0
    if "--use-precision-aware-optimizer" not in flags:
        raise ImportProblemError(KIND, ["--optimizer-cpu-offload needs --use-precision-aware-optimizer (Megatron-LM "
                                        "asserts it)"])
    text = str(flags.get("--optimizer-offload-fraction", "0"))
    try:
        return float(text)
    except ValueError:
        raise ImportProblemError(KIND, [f"--optimizer-offload-fraction {text!r} is not a number"]) from None


def _shard_group(flags: dict[str, str | bool], dp: int, cp: int) -> int:
    """The distributed optimizer's shard group of ``--num-distributed-optimizer-instances N``:
    ``dp / N`` data-parallel ranks (0: all of dp). Megatron-LM shards within ``dp x cp / N``
    consecutive ranks of its data-and-context-parallel group (``megatron/core/parallel_state.py``)
    and all-reduces each shard across the instances only with ``--use-distributed-optimizer``
    (``param_and_grad_buffer.py``)."""
    n = _get(flags, "--num-distributed-optimizer-instances", 1) or 1
    if n == 1:
        return 0
    problems = []
    if "--use-distributed-optimizer" not in flags:
        problems.append(f"--num-distributed-optimizer-instances {n} without --use-distributed-optimizer: Megatron-LM "
                        "all-reduces gradients across the instances only for its distributed optimizer")
    if dp % n:
        problems.append(f"--num-distributed-optimizer-instances {n} does not divide the data-parallel size {dp}"
                        + (f" (a shard group across context-parallel ranks, dp x cp = {dp * cp}, is not modelled)"
                           if (dp * cp) % n == 0 else ""))
    if problems:
        raise ImportProblemError(KIND, problems)
    return dp // n


def _probability(flags: dict[str, str | bool], name: str) -> float:
    """A dropout flag's probability (Megatron-LM's default, 0.1, when absent)."""
    v = flags.get(name)
    if v is None:
        return MEGATRON_DROPOUT
    try:
        p = float(str(v))
    except ValueError:
        raise ImportProblemError(KIND, [f"{name} needs a probability, got {v!r}"]) from None
    if not 0.0 <= p < 1.0:
        raise ImportProblemError(KIND, [f"{name} needs a probability in [0, 1), got {v!r}"])
    return p

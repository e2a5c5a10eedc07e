"""Megatron-LM arguments (``pretrain_gpt.py`` flags, as written by hand or by ``parplan export``).

The text may be one flag per line, a command line, or a ``torchrun ... pretrain_gpt.py ...`` line
(its ``--nnodes`` and ``--nproc-per-node`` then give the GPU count). The model comes from the size
flags (GPT: LayerNorm, GELU, biases; Llama: ``--swiglu``, RMSNorm, no biases, Qwen2's q/k/v biases
with ``--add-qkv-bias`` and Qwen3's q/k norms with ``--qk-layernorm``; Mixtral: Llama with
``--num-experts``; the dropouts from ``--hidden-dropout`` and ``--attention-dropout``, 0.1 when not
given, as Megatron-LM's defaults); ``--vocab-size`` is needed because Megatron-LM otherwise reads it
from the tokenizer. Flags for data, tokenizer, optimizer, logging and checkpoints do not change the
prediction and are listed in ``ignored``; a flag that changes memory or time and is not modelled is
an error.
"""

from __future__ import annotations

import shlex
from typing import Literal

from parplan.imports.common import Imported, ImportProblemError, refusals_as_problems, world_size
from parplan.solver.cost.activations import Recompute
from parplan.solver.frontends.config import TransformerConfig, dropout_field
from parplan.solver.models import ModelSource
from parplan.solver.strategy import CP_COMM, ParallelConfig, Schedule

KIND = "megatron-args"
#: Megatron-LM's ``--hidden-dropout`` and ``--attention-dropout`` when not given
MEGATRON_DROPOUT = 0.1

#: flags that take a value (the others are switches)
_VALUED = {
    "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--num-query-groups",
    "--kv-channels", "--seq-length", "--max-position-embeddings", "--vocab-size", "--normalization",
    "--position-embedding-type", "--num-experts", "--moe-router-topk", "--tensor-model-parallel-size",
    "--pipeline-model-parallel-size", "--expert-model-parallel-size", "--num-layers-per-virtual-pipeline-stage",
    "--recompute-granularity", "--recompute-method", "--recompute-num-layers", "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers", "--micro-batch-size", "--global-batch-size", "--context-parallel-size",
    "--hidden-dropout", "--attention-dropout",
    "--expert-tensor-parallel-size", "--fp8-format", "--cp-comm-type",
}
_SWITCHES = {"--swiglu", "--disable-bias-linear", "--group-query-attention", "--untie-embeddings-and-output-weights",
             "--sequence-parallel", "--use-distributed-optimizer", "--bf16", "--fp16", "--add-qkv-bias",
             "--qk-layernorm", "--tp-comm-overlap", "--overlap-param-gather", "--overlap-grad-reduce"}
#: known flags that do not change memory or time as parplan prices them (with a value, or a switch)
_IGNORED_VALUED = {
    "--data-path", "--split", "--tokenizer-type", "--tokenizer-model", "--vocab-file", "--merge-file", "--lr",
    "--min-lr", "--lr-decay-style", "--lr-decay-iters", "--lr-warmup-iters", "--lr-warmup-fraction",
    "--weight-decay", "--clip-grad", "--adam-beta1", "--adam-beta2", "--adam-eps", "--init-method-std",
    "--train-iters", "--train-samples", "--save", "--load", "--save-interval", "--log-interval", "--eval-iters",
    "--eval-interval", "--seed", "--norm-epsilon", "--rotary-base",
    "--make-vocab-size-divisible-by", "--tensorboard-dir", "--distributed-backend", "--ckpt-format",
    "--distributed-timeout-minutes", "--num-workers", "--exit-duration-in-mins", "--wandb-project",
    "--transformer-impl", "--attention-backend",  # flash attention is priced either way
}
_IGNORED_SWITCHES = {"--mock-data", "--no-masked-softmax-fusion", "--use-mcore-models", "--no-load-optim",
                     "--no-load-rng", "--log-throughput", "--use-rotary-position-embeddings", "--no-bias-gelu-fusion",
                     "--no-bias-dropout-fusion", "--no-rope-fusion", "--use-flash-attn"}


def _tokens(text: str) -> tuple[list[str], int | None, int | None]:
    """The flags after the training script (or all of them), and torchrun's nodes and processes."""
    try:
        words = shlex.split(text.replace("\\\n", " "), comments=True)
    except ValueError as e:
        raise ImportProblemError(KIND, [f"cannot split the arguments: {e}"]) from None
    nodes = procs = None
    script = next((i for i, w in enumerate(words) if w.endswith(".py")), None)
    if script is not None:
        launcher = words[:script]
        for i, w in enumerate(launcher[:-1]):
            if w in ("--nnodes",):
                nodes = _int(launcher[i + 1], w)
            if w in ("--nproc-per-node", "--nproc_per_node"):
                procs = _int(launcher[i + 1], w)
        words = words[script + 1:]
    return words, nodes, procs


def _int(text: str, flag: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ImportProblemError(KIND, [f"{flag} {text!r} is not an integer"]) from None
    if value < 1:
        raise ImportProblemError(KIND, [f"{flag} must be at least 1, got {value}"])
    return value


def read_megatron_args(text: str, gpus: int | None = None) -> Imported:
    """The model, strategy and batch of Megatron-LM arguments on ``gpus`` devices (from a torchrun
    line when it says, else ``gpus``)."""
    words, nodes, procs = _tokens(text)
    flags: dict[str, str | bool] = {}
    unknown: list[str] = []
    ignored: list[str] = []
    i = 0
    while i < len(words):
        w = words[i]
        name, eq, inline = w.partition("=")
        if w.startswith("$"):  # a shell variable of a launch script (EXTRA_ARGS): not ours to read
            ignored.append(w)
            i += 1
            continue
        if not name.startswith("--"):
            unknown.append(w)
            i += 1
            continue
        takes = name in _VALUED or name in _IGNORED_VALUED
        value: str | bool = True
        if eq:
            value = inline
        elif takes or (name not in _SWITCHES and name not in _IGNORED_SWITCHES and i + 1 < len(words)
                       and not words[i + 1].startswith("--")):
            if i + 1 >= len(words):
                raise ImportProblemError(KIND, [f"{name} needs a value"])
            value = words[i + 1]
            i += 1
        i += 1
        if name in _VALUED or name in _SWITCHES:
            flags[name] = value
        elif name in _IGNORED_VALUED or name in _IGNORED_SWITCHES:
            ignored.append(name)
        else:
            unknown.append(name if value is True else f"{name} {value}")
    return _imported(flags, world_size(KIND, nodes, procs, gpus), procs, unknown, ignored)


def _get(flags: dict[str, str | bool], name: str, default: int | None = None) -> int | None:
    v = flags.get(name)
    if v is None:
        return default
    if v is True:
        raise ImportProblemError(KIND, [f"{name} needs a value"])
    return _int(str(v), name)


def _imported(flags: dict[str, str | bool], world: int, per_node: int | None, unknown: list[str],
              ignored: list[str]) -> Imported:
    _require(flags)
    problems: list[str] = []
    cp_comm = str(flags.get("--cp-comm-type", "p2p"))
    if (_get(flags, "--context-parallel-size", 1) or 1) > 1 and cp_comm not in CP_COMM:
        problems.append(f"context parallelism with --cp-comm-type {cp_comm}: parplan prices the p2p ring and "
                        "the all-to-all (a2a)")
    if "--fp8-format" in flags:
        problems.append("FP8 training (--fp8-format) is not modelled yet")
    ept = _get(flags, "--expert-tensor-parallel-size")
    tp = _get(flags, "--tensor-model-parallel-size", 1) or 1
    if ept is not None and ept != tp:
        problems.append("an expert tensor-parallel size other than the tensor-parallel size is not modelled")
    family = _family(flags, problems)
    recompute = _recompute(flags, problems)
    if "--fp16" in flags and "--bf16" in flags:
        problems.append("both --fp16 and --bf16")
    if problems:
        raise ImportProblemError(KIND, problems)
    assert recompute is not None
    with refusals_as_problems(KIND):
        cfg, seq = _config(flags, family)
        strategy = _strategy(flags, world, cfg.layers, tp, recompute, cp_comm)
    return Imported(KIND, ModelSource(cfg.name, config=cfg), strategy, seq, world, per_node, "megatron", unknown,
                    ignored)


def _require(flags: dict[str, str | bool]) -> None:
    """The flags without which the model or the batch is unknown."""
    missing = [f for f in ("--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length",
                           "--micro-batch-size") if f not in flags]
    if "--vocab-size" not in flags:
        missing.append("--vocab-size (Megatron-LM reads it from the tokenizer; give it here)")
    if missing:
        raise ImportProblemError(KIND, [f"missing {', '.join(missing)}"])


def _family(flags: dict[str, str | bool], problems: list[str]) -> Literal["gpt", "llama", "mixtral"]:
    """The model's kind from ``--num-experts`` and ``--swiglu``; ``problems`` gets the flags that disagree."""
    swiglu = "--swiglu" in flags
    norm = str(flags.get("--normalization", "LayerNorm"))
    pos = str(flags.get("--position-embedding-type", "learned_absolute"))
    experts = _get(flags, "--num-experts", 0) or 0
    family: Literal["gpt", "llama", "mixtral"] = "mixtral" if experts else ("llama" if swiglu else "gpt")
    if family == "gpt":
        if norm != "LayerNorm" or pos != "learned_absolute" or "--disable-bias-linear" in flags:
            problems.append("a GPT model without --swiglu has LayerNorm, learned positions and biases in parplan "
                            f"(got --normalization {norm}, --position-embedding-type {pos}"
                            + (", --disable-bias-linear" if "--disable-bias-linear" in flags else "") + ")")
    elif norm != "RMSNorm" or pos != "rope" or "--disable-bias-linear" not in flags:
        problems.append("a --swiglu model is parplan's Llama: --normalization RMSNorm, --position-embedding-type "
                        f"rope and --disable-bias-linear (got {norm}, {pos}"
                        + ("" if "--disable-bias-linear" in flags else ", biases") + ")")
    if family == "gpt" and ("--add-qkv-bias" in flags or "--qk-layernorm" in flags):
        problems.append("--add-qkv-bias and --qk-layernorm are modelled for --swiglu (Llama-style) models only")
    return family


def _recompute(flags: dict[str, str | bool], problems: list[str]) -> Recompute | None:
    """The recomputation ``--recompute-*`` ask for; None (and a problem) when parplan does not model it."""
    granularity = str(flags.get("--recompute-granularity", "none"))
    recompute = {"none": Recompute.NONE, "selective": Recompute.SELECTIVE, "full": Recompute.FULL}.get(granularity)
    if recompute is None:
        problems.append(f"--recompute-granularity {granularity}")
    elif recompute is Recompute.FULL:
        method = str(flags.get("--recompute-method", ""))
        per = _get(flags, "--recompute-num-layers", 1)
        if method != "uniform" or per != 1:
            problems.append("full recomputation is modelled for every layer (--recompute-method uniform "
                            f"--recompute-num-layers 1; got {method or 'no method'}, {per})")
    return recompute


def _config(flags: dict[str, str | bool], family: Literal["gpt", "llama", "mixtral"]) -> tuple[TransformerConfig, int]:
    """(the model the size flags describe, ``--seq-length``)."""
    layers = _get(flags, "--num-layers")
    hidden, heads = _get(flags, "--hidden-size"), _get(flags, "--num-attention-heads")
    seq, vocab = _get(flags, "--seq-length"), _get(flags, "--vocab-size")
    assert layers and hidden and heads and seq and vocab
    # a GPT's learned position table has --max-position-embeddings rows (parplan's config seq_len)
    positions = max(seq, _get(flags, "--max-position-embeddings", seq) or seq)
    kv = _get(flags, "--num-query-groups") if "--group-query-attention" in flags else None
    # Megatron-LM's dropouts default to 0.1. parplan's model has one probability for both; a dropout
    # keeps its mask whatever the probability, so the larger stands for both (a mask more, never one
    # less, when they differ)
    dropout = max(_probability(flags, "--hidden-dropout"), _probability(flags, "--attention-dropout"))
    cfg = TransformerConfig(
        family=family, name="megatron-args", layers=layers, hidden=hidden, heads=heads,
        ffn=_get(flags, "--ffn-hidden-size", 4 * hidden) or 4 * hidden, vocab=vocab, seq_len=positions, kv_heads=kv,
        head_dim=_get(flags, "--kv-channels"), tied_embeddings="--untie-embeddings-and-output-weights" not in flags,
        num_experts=_get(flags, "--num-experts", 0) or 0, top_k=_get(flags, "--moe-router-topk", 2) or 2,
        qkv_bias="--add-qkv-bias" in flags, qk_norm="--qk-layernorm" in flags,
        dropout=dropout_field(family, dropout))
    return cfg, seq


def _strategy(flags: dict[str, str | bool], world: int, layers: int, tp: int, recompute: Recompute,
              cp_comm: str) -> ParallelConfig:
    """The degrees, batch, pipeline and overlaps the flags give on ``world`` GPUs."""
    pp = _get(flags, "--pipeline-model-parallel-size", 1) or 1
    cp = _get(flags, "--context-parallel-size", 1) or 1
    if world % (tp * pp * cp):
        what = "tp x pp x cp" if cp > 1 else "tp x pp"
        raise ImportProblemError(KIND, [f"{what} = {tp * pp * cp} does not divide the {world} GPUs"])
    dp = world // (tp * pp * cp)
    mb = _get(flags, "--micro-batch-size") or 1
    gb = _get(flags, "--global-batch-size", mb * dp) or mb * dp
    if gb % (mb * dp):
        raise ImportProblemError(KIND, [f"--global-batch-size {gb} is not a multiple of --micro-batch-size {mb} x "
                                        f"data-parallel size {dp}"])
    per_virtual = _get(flags, "--num-layers-per-virtual-pipeline-stage")
    virtual = 1
    if per_virtual is not None:
        if layers % (pp * per_virtual):
            raise ImportProblemError(KIND, [f"{layers} layers are not {pp} stages x chunks of {per_virtual}"])
        virtual = layers // (pp * per_virtual)
    partition = _partition(flags, layers, pp)
    return ParallelConfig(
        tp=tp, pp=pp, dp=dp, zero=1 if "--use-distributed-optimizer" in flags else 0,
        sequence_parallel="--sequence-parallel" in flags, recompute=recompute, micro_batch=mb,
        num_microbatches=gb // (mb * dp),
        schedule=Schedule.INTERLEAVED if virtual > 1 else Schedule.ONE_F_ONE_B, virtual_stages=virtual,
        precision="fp16" if "--fp16" in flags else ("bf16" if "--bf16" in flags else "fp32"),
        expert_parallel=_get(flags, "--expert-model-parallel-size", 1) or 1, partition=partition, cp=cp,
        cp_comm=cp_comm if cp > 1 else "p2p", tp_comm_overlap="--tp-comm-overlap" in flags,
        overlap_param_gather="--overlap-param-gather" in flags,
        overlap_grad_reduce="--overlap-grad-reduce" in flags or dp * cp == 1)


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


def _partition(flags: dict[str, str | bool], layers: int, pp: int) -> tuple[int, ...] | None:
    first = _get(flags, "--decoder-first-pipeline-num-layers")
    last = _get(flags, "--decoder-last-pipeline-num-layers")
    if first is None and last is None:
        return None
    if pp < 2:
        raise ImportProblemError(KIND, ["first/last stage layer counts need pipeline stages"])
    middle_stages = pp - (first is not None) - (last is not None)
    rest = layers - (first or 0) - (last or 0)
    if middle_stages < 0 or rest < 0 or (middle_stages and rest % middle_stages) or (not middle_stages and rest):
        raise ImportProblemError(KIND, [f"{layers} layers do not split as first {first}, last {last} and "
                                   f"{middle_stages} even stages"])
    even = rest // middle_stages if middle_stages else 0
    parts = [first if first is not None else even] + [even] * (pp - 2) + [last if last is not None else even]
    return tuple(parts)

"""The validation matrix: small GPT and Llama models under every kind of strategy the searches return.

:data:`STRATEGIES` (the base matrix, 28 runs): TP 2, DP 2, ZeRO-3 over 4, PP 2 with GPipe and with 1F1B,
TP 2 x PP 2, and TP 2 x DP 2 with sequence parallelism, each without and with full activation
checkpointing. In CI (the tests' default) each strategy runs once without checkpointing and once with
full checkpointing, on alternating models (14 runs); the full matrix runs both on both.
:data:`EXTENDED` adds the other kinds: ZeRO-1 (DDP +
``ZeroRedundancyOptimizer``), ZeRO-2, gradient accumulation without pipelining under DDP, ZeRO-2
and ZeRO-3, ZeRO-2/3 with TP (with and without sequence parallelism) and inside pipeline stages,
interleaved 1F1B, uneven pipeline partitions, selective recomputation (the searches' default),
torchtitan's per-operator selective checkpointing under FSDP2,
DP-inner nesting (TP ranks strided), per-block mixes of ZeRO stage and recomputation as the DP
search returns them, FSDP2 without resharding after forward under interleaved 1F1B (torchtitan's PP
setting), nanotron's buffers (bf16 weights, an fp32 gradient accumulator beside DDP's buckets, its
fp32 loss; :mod:`parplan.agent.nanotron_exec`), Megatron-LM's offloaded optimizer (:mod:`parplan.agent.offload`),
and, as a trainer's alternative the cost model does
not express, FSDP2 reduce-scattering every accumulated micro-batch. Each extended kind is marked for CI (each marked
recomputation on one model: both models differ in the model's code, not in the strategy's) or for
the full matrix only (``bench/model_accuracy.py``, or the tests with ``PARPLAN_AGENT_MATRIX=full``).
At most 4 ranks.
Shared by the tests (``tests/agent``) and ``bench/model_accuracy.py``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from parplan.agent.run_spec import RunSpec
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.frontends.presets import get_preset

#: GPT-family model (learned positions, tied embeddings, dropout 0.1), 3.45 M parameters.
GPT_TINY = get_preset("gpt-1.7b").with_(name="gpt-tiny", layers=4, hidden=256, heads=8, ffn=1024, vocab=1024,
                                         seq_len=128)
#: Llama-family model (RMSNorm, RoPE, grouped-query attention 8/4, SwiGLU, untied head), 3.43 M.
LLAMA_TINY = get_preset("llama-2-70b").with_(name="llama-tiny", layers=4, hidden=256, heads=8, kv_heads=4,
                                              ffn=688, vocab=1024, seq_len=128)

MODELS = (GPT_TINY, LLAMA_TINY)

#: (name, strategy fields) of the matrix; PP runs 4 micro-batches per step.
STRATEGIES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("tp2", {"tp": 2}),
    ("dp2", {"dp": 2}),
    ("zero3-dp4", {"dp": 4, "zero": 3}),
    ("pp2-gpipe", {"pp": 2, "schedule": "gpipe", "num_microbatches": 4}),
    ("pp2-1f1b", {"pp": 2, "schedule": "1f1b", "num_microbatches": 4}),
    ("tp2-pp2", {"tp": 2, "pp": 2, "num_microbatches": 4}),
    ("tp2-dp2-sp", {"tp": 2, "dp": 2, "sequence_parallel": True}),
)

RECOMPUTE = ("none", "full")


@dataclass(frozen=True)
class Kind:
    """One extended kind of strategy: its fields, the recomputations it runs with (``mixed`` when
    the fields give ``layer_recompute``), and those of them CI runs: ``rec`` for every model or
    ``model:rec`` for one (the rest run in the full matrix only)."""

    name: str
    fields: dict[str, Any]
    recompute: tuple[str, ...] = RECOMPUTE
    ci: tuple[str, ...] = RECOMPUTE
    models: tuple[str, ...] = field(default=("gpt-tiny", "llama-tiny"))

    def in_ci(self, model: str, rec: str) -> bool:
        return rec in self.ci or f"{model}:{rec}" in self.ci


_PP = {"pp": 2, "num_microbatches": 4}

#: The kinds of strategy beyond :data:`STRATEGIES`.
EXTENDED: tuple[Kind, ...] = (
    Kind("zero1-dp2", {"dp": 2, "zero": 1}, ci=("none",)),
    Kind("zero2-dp4", {"dp": 4, "zero": 2}, ci=("none",)),
    Kind("dp2-m2", {"dp": 2, "num_microbatches": 2}, ci=("full",)),
    Kind("zero1-dp2-m2", {"dp": 2, "zero": 1, "num_microbatches": 2}, ci=()),
    Kind("zero2-dp2-m2", {"dp": 2, "zero": 2, "num_microbatches": 2}, ci=("none",)),
    Kind("zero3-dp4-m2", {"dp": 4, "zero": 3, "num_microbatches": 2}, ci=("full",)),
    # FSDP2 may instead reduce-scatter every micro-batch (gradients stay sharded, more traffic): a
    # choice of the trainer the cost model's runtime rule does not express (it keeps them unsharded).
    Kind("zero2-dp2-m2-sync", {"dp": 2, "zero": 2, "num_microbatches": 2, "fsdp_sync_every_microbatch": True},
         recompute=("none",), ci=()),
    Kind("zero3-dp4-m2-sync", {"dp": 4, "zero": 3, "num_microbatches": 2, "fsdp_sync_every_microbatch": True},
         recompute=("none",), ci=()),
    Kind("tp2-zero2-dp2", {"tp": 2, "dp": 2, "zero": 2}, ci=("none",)),
    Kind("tp2-zero2-dp2-sp", {"tp": 2, "dp": 2, "zero": 2, "sequence_parallel": True},
         recompute=(*RECOMPUTE, "selective"), ci=("full",)),
    Kind("tp2-zero3-dp2", {"tp": 2, "dp": 2, "zero": 3}, ci=("full",)),
    Kind("tp2-zero3-dp2-sp", {"tp": 2, "dp": 2, "zero": 3, "sequence_parallel": True}, ci=("none",)),
    Kind("pp2-zero1-dp2", {**_PP, "dp": 2, "zero": 1}, ci=("gpt-tiny:none",)),
    Kind("pp2-zero2-dp2", {**_PP, "dp": 2, "zero": 2}, ci=("none",)),
    Kind("pp2-zero3-dp2", {**_PP, "dp": 2, "zero": 3}, ci=("full",)),
    Kind("pp2-interleaved-v2", {**_PP, "schedule": "interleaved", "virtual_stages": 2}, ci=("none",)),
    Kind("pp2-1f1b-part1-3", {**_PP, "partition": (1, 3)}, ci=("full",)),
    Kind("pp2-gpipe-part3-1", {**_PP, "schedule": "gpipe", "partition": (3, 1)}, recompute=("none",), ci=()),
    # The searches' default recomputation (the attention core only), on kinds of the base matrix.
    Kind("zero3-dp4", {"dp": 4, "zero": 3}, recompute=("selective",), ci=("gpt-tiny:selective",)),
    Kind("pp2-1f1b", {**_PP}, recompute=("selective",), ci=()),
    Kind("tp2-dp2-sp", {"tp": 2, "dp": 2, "sequence_parallel": True}, recompute=("selective",),
         ci=("llama-tiny:selective",)),
    # torchtitan's per-operator selective checkpointing (the searches' middle recomputation on
    # PyTorch-native runtimes), on its usual layout: FSDP2.
    Kind("zero3-dp2", {"dp": 2, "zero": 3}, recompute=("op",), ci=("llama-tiny:op",), models=("llama-tiny",)),
    # The DP search's other nesting order: DP ranks consecutive, TP ranks strided.
    Kind("tp2-dp2-sp-dpinner", {"tp": 2, "dp": 2, "sequence_parallel": True, "tp_inner": False},
         recompute=("none",), ci=()),
    Kind("tp2-zero3-dp2-dpinner", {"tp": 2, "dp": 2, "zero": 3, "tp_inner": False}, recompute=("full",), ci=()),
    # As the DP search returns them: early blocks sharded and checkpointed, later ones not.
    Kind("mixed-dp4", {"dp": 4, "zero": 3, "layer_zero": (3, 3, 2, 2),
                       "layer_recompute": ("full", "full", "none", "none")}, recompute=("mixed",), ci=("mixed",)),
    Kind("mixed-tp2-dp2-sp", {"tp": 2, "dp": 2, "zero": 2, "sequence_parallel": True, "layer_zero": (2, 3, 2, 3),
                              "layer_recompute": ("none", "full", "full", "none")}, recompute=("mixed",),
         ci=("llama-tiny:mixed",)),
    # Appended last (a kind marked for every model runs on one by its place in this list): each names its model.
    # torchtitan's PP + FSDP2 (no resharding after forward) under the interleaved schedule: every chunk
    # of a device keeps its gathered weights and unsharded gradients between micro-batches.
    Kind("pp2-interleaved-v2-zero2-dp2", {**_PP, "schedule": "interleaved", "virtual_stages": 2, "dp": 2, "zero": 2},
         recompute=("none",), ci=("gpt-tiny:none",)),
    # nanotron's buffers (bf16 weights, fp32 gradient accumulator and master weights, DDP's bf16 buckets,
    # gradients made anew each micro-batch, the fp32 Megatron-style loss) on its Llama: checked against
    # the fp32 reference within bf16's rounding.
    Kind("nanotron-dp2-m2", {"dp": 2, "num_microbatches": 2, "trainer": "nanotron", "rtol": 0.02, "atol": 1e-3},
         recompute=("none",), ci=("llama-tiny:none",), models=("llama-tiny",)),
    # Megatron-LM's offloaded optimizer (--optimizer-cpu-offload) on the distributed optimizer's shard (ZeRO-1),
    # all of it and half of it, and half of a whole model's optimizer (dp 1); the host's part is measured as
    # host memory (parplan.agent.offload). tests/agent/test_agent_offload.py runs two of them.
    Kind("zero1-dp2-offload1", {"dp": 2, "zero": 1, "optimizer_offload": 1.0}, recompute=("none",), ci=()),
    Kind("zero1-dp2-offload0.5", {"dp": 2, "zero": 1, "optimizer_offload": 0.5}, recompute=("none",), ci=()),
    Kind("zero1-offload0.5", {"zero": 1, "optimizer_offload": 0.5}, recompute=("none",), ci=()),
    # Megatron-LM's per-module recomputation (--recompute-modules): the MLP under tensor_parallel.checkpoint,
    # both norms under CheckpointWithoutOutput (their outputs freed, refilled in backward), the core too.
    # CI runs them in tests/agent/test_agent_recompute_modules.py (with the correctness checks), not here.
    Kind("modules", {}, recompute=("selective:mlp", "selective:layernorm+mlp"), ci=()),
    Kind("modules-tp2", {"tp": 2}, recompute=("selective:mlp", "selective:core_attn+layernorm+mlp"), ci=()),
    Kind("modules-dp2", {"dp": 2}, recompute=("selective:layernorm+mlp",), ci=()),
    Kind("modules-zero3-dp2", {"dp": 2, "zero": 3}, recompute=("selective:layernorm+mlp",), ci=()),
)


def matrix_specs(models: tuple[TransformerConfig, ...] = MODELS, full: bool = True,
                 **overrides: Any) -> list[RunSpec]:
    """Every (model, strategy, recompute) of the base matrix as a run spec; without ``full``, CI's
    set: each strategy once per recomputation, on one model, the models alternating (without
    checkpointing on one, with full checkpointing on the other)."""
    out = []
    for m, cfg in enumerate(models):
        for i, (name, fields) in enumerate(STRATEGIES):
            for r, rec in enumerate(RECOMPUTE):
                if not full and (i + r) % len(models) != m:
                    continue
                out.append(RunSpec(model=asdict(cfg), recompute=rec, seq_len=cfg.seq_len,
                                   label=f"{cfg.name}/{name}/{rec}", **{**fields, **overrides}))
    return out


def extended_specs(full: bool = False, models: tuple[TransformerConfig, ...] = MODELS,
                   **overrides: Any) -> list[RunSpec]:
    """The extended kinds as run specs: CI's representative set (a kind marked for every model runs
    on one, alternating from kind to kind), or all of them with ``full``."""
    out = []
    for m, cfg in enumerate(models):
        for i, kind in enumerate(EXTENDED):
            if cfg.name not in kind.models:
                continue
            for rec in kind.recompute:
                if not (full or (kind.in_ci(cfg.name, rec) and (f"{cfg.name}:{rec}" in kind.ci
                                                                   or i % len(models) == m))):
                    continue
                fields = {**kind.fields, **({} if rec == "mixed" else {"recompute": rec})}
                out.append(RunSpec(model=asdict(cfg), seq_len=cfg.seq_len, label=f"{cfg.name}/{kind.name}/{rec}",
                                   **{**fields, **overrides}))
    return out


def all_specs(full: bool = False, **overrides: Any) -> list[RunSpec]:
    """The base matrix followed by the extended kinds (CI's set, or all with ``full``)."""
    return matrix_specs(full=full, **overrides) + extended_specs(full, **overrides)

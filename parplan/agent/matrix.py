"""The validation matrix: small GPT and Llama models under the strategies issue 6 names.

TP 2, DP 2, ZeRO-3 over 4, PP 2 with GPipe and with 1F1B, TP 2 x PP 2, and TP 2 x DP 2 with
sequence parallelism, each without and with full activation checkpointing. Shared by the tests
(``tests/agent``) and ``bench/model_accuracy.py``.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from parplan.agent.executor import RunSpec
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.frontends.presets import get_preset

#: GPT-family model (learned positions, tied embeddings, dropout 0.1), 3.45 M parameters.
GPT_TINY = get_preset("gpt-1.7b").with_(name="gpt-tiny", layers=4, hidden=256, heads=8, ffn=1024, vocab=1024,
                                         seq_len=128)
#: Llama-family model (RMSNorm, RoPE, grouped-query attention 8/4, SwiGLU, untied head), 3.43 M.
LLAMA_TINY = get_preset("llama-2-70b").with_(name="llama-tiny", layers=4, hidden=256, heads=8, kv_heads=4,
                                              ffn=688, vocab=1024, seq_len=128)

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


def matrix_specs(models: tuple[TransformerConfig, ...] = (GPT_TINY, LLAMA_TINY), **overrides: Any) -> list[RunSpec]:
    """Every (model, strategy, recompute) of the matrix as a run spec."""
    out = []
    for cfg in models:
        for name, fields in STRATEGIES:
            for rec in RECOMPUTE:
                out.append(RunSpec(model=asdict(cfg), recompute=rec, seq_len=cfg.seq_len,
                                   label=f"{cfg.name}/{name}/{rec}", **{**fields, **overrides}))
    return out

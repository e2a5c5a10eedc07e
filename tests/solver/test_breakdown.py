"""The time model's one-GPU step by phase and kernel category (parplan/solver/cost/breakdown.py),
which bench/step_breakdown.py sets beside a profiled step."""

from __future__ import annotations

import pytest

from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.breakdown import CATEGORIES, KIND_CATEGORY, PHASES, single_gpu_breakdown
from parplan.solver.cost.runtime import Runtime
from parplan.solver.frontends.presets import get_preset
from parplan.solver.ir import OpKind

GPT = get_preset("gpt-1.7b").with_(name="gpt-small", layers=4, hidden=1024, heads=16, ffn=4096, seq_len=2048)
LLAMA = get_preset("llama-2-70b").with_(name="llama-small", layers=4, hidden=1024, heads=16, kv_heads=4, ffn=2816,
                                        vocab=32000, seq_len=2048)


def test_every_operator_kind_has_a_category() -> None:
    assert set(KIND_CATEGORY.values()) <= set(CATEGORIES)
    assert set(OpKind) - set(KIND_CATEGORY) == {OpKind.INPUT, OpKind.PARAMETER}


@pytest.mark.parametrize("cfg", [GPT, LLAMA], ids=lambda c: c.name)
@pytest.mark.parametrize("recompute", [Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL])
def test_categories_add_up_to_the_evaluators_step(cfg, recompute: Recompute) -> None:  # type: ignore[no-untyped-def]
    """Each phase's categories add up to what the evaluator prices for it, and the phases to its step
    (one GPU: no communication, nothing exposed)."""
    b = single_gpu_breakdown(cfg, 2, cfg.seq_len, recompute, "H100-80GB", Runtime.TORCH, "bf16-grad16",
                             num_microbatches=2)
    for phase in PHASES:
        assert b.phase_seconds(phase) == pytest.approx(b.totals[phase], rel=1e-9)
    assert sum(b.totals.values()) == pytest.approx(b.step_seconds, rel=1e-9)
    assert {k for k, v in b.phases["optimizer"].items() if v} == {"optimizer"}
    fwd = b.phases["forward"]
    assert min(fwd["gemm"], fwd["attention"], fwd["norm"], fwd["elementwise"], fwd["loss"]) > 0


@pytest.mark.parametrize("cfg", [GPT, LLAMA], ids=lambda c: c.name)
def test_full_recomputation_adds_each_blocks_forward_to_backward(cfg) -> None:  # type: ignore[no-untyped-def]
    """Full recomputation reruns every block's forward inside backward: backward grows by at most the
    forward of each category, and by exactly the attention cores' forward (attention runs in the
    blocks only; the embedding and the head are not recomputed)."""
    none = single_gpu_breakdown(cfg, 2, cfg.seq_len, Recompute.NONE, "H100-80GB")
    full = single_gpu_breakdown(cfg, 2, cfg.seq_len, Recompute.FULL, "H100-80GB")
    for cat in CATEGORIES:
        extra = full.phases["backward"][cat] - none.phases["backward"][cat]
        assert -1e-12 <= extra <= none.phases["forward"][cat] + 1e-12, cat
    assert full.phases["backward"]["attention"] - none.phases["backward"]["attention"] == pytest.approx(
        none.phases["forward"]["attention"], rel=1e-9)
    assert full.phases["forward"] == none.phases["forward"]
    assert full.phases["backward"]["loss"] == pytest.approx(none.phases["backward"]["loss"], rel=1e-12)

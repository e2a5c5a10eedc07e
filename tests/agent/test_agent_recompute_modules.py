"""Megatron-LM's per-module recomputation run for real (gloo, CPU): measured against the prediction
for the same module set, and the activations each module drops against closed forms read off PyTorch's
kernels (GELU keeps its input, a linear its input, LayerNorm its input, mean and rstd), not off parplan's
rules. The matrix's tolerances (``tests/agent/test_agent_matrix.py``); loss and every gradient equal
a single-process run without recomputation (the executor's check)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pytest

from parplan.agent.matrix import GPT_TINY, LLAMA_TINY
from parplan.agent.run_spec import RunSpec
from parplan.agent.validate import run_and_compare
from parplan.solver.errors import StrategyError

TARGET = 0.03
UNDER = 0.02
F32 = 4

RUNS = [("gpt-tiny", 1, "none"), ("gpt-tiny", 1, "selective:mlp"), ("gpt-tiny", 1, "selective:layernorm+mlp"),
        ("llama-tiny", 2, "selective:core_attn+layernorm+mlp")]


@pytest.fixture(scope="module")
def results() -> dict[tuple[str, int, str], dict[str, Any]]:
    cfgs = {c.name: c for c in (GPT_TINY, LLAMA_TINY)}
    specs = [RunSpec(model=asdict(cfgs[m]), tp=tp, recompute=rec, seq_len=cfgs[m].seq_len, timing_steps=1,
                     label=f"{m}/tp{tp}/{rec}") for m, tp, rec in RUNS]
    return dict(zip(RUNS, run_and_compare(specs, "cpu"), strict=True))


def _activations(r: dict[str, Any]) -> int:
    return max(int(rk["measured"]["breakdown"]["activations"]) for rk in r["ranks"])


@pytest.mark.slow
@pytest.mark.parametrize("run", RUNS, ids=lambda r: f"{r[0]}/tp{r[1]}/{r[2]}")
def test_measured_peak_within_the_matrix_tolerance_and_correct(results: dict[Any, Any],
                                                               run: tuple[str, int, str]) -> None:
    r = results[run]
    assert r["correct"] is True
    assert all(rk["check"]["ok"] for rk in r["ranks"])
    err = r["most_loaded"]["relative_error"]
    assert abs(err) <= TARGET and err <= UNDER, f"{run}: measured peak off by {err:+.2%}"


@pytest.mark.slow
def test_each_module_drops_its_closed_form(results: dict[Any, Any]) -> None:
    """GPT-tiny (4 layers, s 128, h 256, ffn 1024, b 1): ``mlp`` drops GELU's input and fc2's input
    (fc1 keeps the norm's output, the checkpoint's input); ``layernorm`` drops both norms' outputs
    (read by q/k/v and fc1) and their saved mean and rstd (the checkpoint keeps the residual stream,
    which the next block's norm keeps anyway)."""
    c = GPT_TINY
    s, layers = c.seq_len, c.layers
    none, mlp, both = (_activations(results[("gpt-tiny", 1, p)])
                       for p in ("none", "selective:mlp", "selective:layernorm+mlp"))
    assert none - mlp == layers * 2 * s * c.ffn * F32
    assert mlp - both == layers * 2 * (s * c.hidden + 2 * s) * F32


def test_what_the_agent_does_not_run_is_one_line() -> None:
    base = {"model": asdict(LLAMA_TINY), "seq_len": 128}
    for fields, why in (({"recompute": "selective:mla_up_proj"}, "mla_up_proj"),
                        ({"recompute": "selective:attn"}, "unknown recompute module"),
                        ({"recompute": "selective:layernorm", "tp": 2, "sequence_parallel": True}, "DTensor")):
        with pytest.raises(StrategyError, match=why) as info:
            RunSpec(**base, **fields).validate()
        assert "\n" not in str(info.value)

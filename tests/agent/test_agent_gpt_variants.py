"""A GPT with RMSNorm, rotary positions and no linear biases (Megatron-LM's ``--normalization RMSNorm
--position-embedding-type rope --disable-bias-linear``) run for real (gloo, CPU, tensor parallelism 2):
the measured peak against the prediction, within the matrix's tolerances
(``tests/agent/test_agent_matrix.py``); loss and every gradient equal a single-process run (the
executor's check)."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from parplan.agent.matrix import GPT_TINY
from parplan.agent.run_spec import RunSpec
from parplan.agent.validate import run_and_compare

TARGET = 0.03
UNDER = 0.02


@pytest.mark.slow
def test_a_gpt_with_rmsnorm_rope_and_no_biases_is_measured_as_predicted() -> None:
    cfg = GPT_TINY.with_(norm="rmsnorm", positions="rope", linear_bias=False)
    spec = RunSpec(model=asdict(cfg), tp=2, recompute="none", seq_len=cfg.seq_len, timing_steps=1,
                   label="gpt-tiny-rmsnorm-rope-unbiased/tp2")
    (r,) = run_and_compare([spec], "cpu")
    assert r["correct"] is True
    assert all(rk["check"]["ok"] for rk in r["ranks"])
    err = r["most_loaded"]["relative_error"]
    assert abs(err) <= TARGET and err <= UNDER, f"measured peak off by {err:+.2%}"

"""The issue-6 matrix end to end on this CPU machine (gloo, up to 4 processes).

Small GPT and Llama models under TP 2, DP 2, ZeRO-3 over 4, PP 2 with GPipe and with 1F1B,
TP 2 x PP 2 and TP 2 x DP 2 with sequence parallelism, each without and with full activation
checkpointing: 28 runs in two launches (2 and 4 processes). For every run:

- loss and gradients equal a single-process reference: ``torch.allclose(rtol=1e-4, atol=1e-6)``
  for every gradient and the step-1 loss, and the loss after one Adam step (fp32);
- measured parameters and gradients equal the prediction to the byte, optimizer states within
  Adam's 4-byte step counters;
- the most loaded rank's measured peak is within 5 % of the predicted peak, except for the
  configurations in ``KNOWN_GAPS``: real gaps of the cost model (reported to the lead, who owns
  parplan/solver) or of the PyTorch API used, each with its diagnosis; their bound is the error
  observed plus a margin, so the test catches regressions and passes once the model is fixed.
"""

from __future__ import annotations

from typing import Any

import pytest

from parplan.agent.matrix import matrix_specs
from parplan.agent.validate import run_and_compare

TARGET = 0.05

#: label -> (bound on |relative error| of the most loaded rank's peak, gaps). Gaps (evidence per
#: category in bench/out/model_accuracy.txt). Fixed in the cost model since first measured:
#: G1 (backward gradient workspace, tied-embedding gradients, Adam's workspace), G2 (a recomputed
#: block keeps what an uncheckpointed forward keeps), G3 (FSDP2's gathered root and reduce-scatter
#: buffers), G9 (the model added every category's peak; under FSDP2 the gathered-weight and
#: gradient buffers peak after part of the activations is freed: parplan.solver.cost.fsdp walks
#: the backward instead, and the ZeRO-3 runs went from -19..-8% to within 1%); and, as rules of
#: PyTorch's runtime (parplan.solver.cost.runtime, which the agent
#: predicts for): G5 (CPU RMSNorm keeps x*rstd), G6 (`replicate` of TP modules keeps an unsharded
#: copy of the parameters through backward), G7 (DTensor sequence parallelism saves the gathered
#: inputs of column-parallel linears), G8 (the vocabulary-parallel embedding's backward makes the
#: whole table's gradient); G4 (under pipelining the tied embedding's two gradients were counted on
#: every stage, though only a stage holding both the embedding and the head has both; and
#: torch.distributed.pipelining keeps each in-flight micro-batch's sent output, a runtime rule).
#: None is open: every run is within TARGET. A gap found later goes here with its bound and reason.
KNOWN_GAPS: dict[str, tuple[float, str]] = {}

SPECS = matrix_specs(timing_steps=1)


@pytest.fixture(scope="module")
def results() -> dict[str, Any]:
    out = run_and_compare(SPECS, "cpu")
    return {s.label: r for s, r in zip(SPECS, out, strict=True)}


@pytest.mark.slow
@pytest.mark.parametrize("label", [s.label for s in SPECS])
def test_matrix_configuration(results: dict[str, Any], label: str) -> None:
    r = results[label]
    world = SPECS[[s.label for s in SPECS].index(label)].world
    assert [x["rank"] for x in r["ranks"]] == list(range(world))
    for rk in r["ranks"]:
        check = rk["check"]
        assert check["ok"], check["mismatches"]
        assert check["parameters_compared"] > 0 and not check["mismatches"]
        meas, pred = rk["measured"]["breakdown"], rk["predicted"]["breakdown"]
        assert meas["parameters"] == pred["parameters"]
        assert meas["gradients"] == pred["gradients"]
        assert 0 <= meas["optimizer_states"] - pred["optimizer_states"] <= 4 * 200
        assert meas["activations"] > 0 and meas["temporary"] > 0
        assert rk["measured"]["peak_bytes"] >= max(meas[k] for k in meas)
    assert any("loss" in rk["check"] for rk in r["ranks"])
    assert r["correct"] is True
    err = abs(r["most_loaded"]["relative_error"])
    bound, why = KNOWN_GAPS.get(label, (TARGET, ""))
    assert err <= bound, f"{label}: most loaded rank off by {err:.1%} (bound {bound:.0%}) {why}"


@pytest.mark.slow
def test_beyond_the_matrix_runs_correctly() -> None:
    """Interleaved 1F1B (2 chunks per rank), ZeRO-2 (FSDP2 without resharding after forward) and
    gradient accumulation under DDP: correct against the single-process run."""
    from dataclasses import asdict

    from parplan.agent.executor import RunSpec
    from parplan.agent.matrix import GPT_TINY, LLAMA_TINY

    specs = [RunSpec(model=asdict(LLAMA_TINY), pp=2, schedule="interleaved", virtual_stages=2, num_microbatches=4,
                     recompute="full", timing_steps=1, label="interleaved"),
             RunSpec(model=asdict(GPT_TINY), dp=2, zero=2, recompute="selective", timing_steps=1, label="zero2"),
             RunSpec(model=asdict(GPT_TINY), dp=2, num_microbatches=2, recompute="none", timing_steps=1,
                     label="accumulation")]
    for r in run_and_compare(specs, "cpu"):
        assert r["correct"] is True, r["label"]

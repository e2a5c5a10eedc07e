"""The validation matrix end to end on this CPU machine (gloo, up to 4 processes).

CI's set of :mod:`parplan.agent.matrix` (35 runs): small GPT and Llama models under TP 2, DP 2,
ZeRO-3 over 4, PP 2 with GPipe and with 1F1B, TP 2 x PP 2 and TP 2 x DP 2 with sequence parallelism,
each without activation checkpointing on one model and with full checkpointing on the other; and each
representative extended kind (ZeRO-1, ZeRO-2, gradient accumulation, ZeRO-2/3 with TP, SP and PP,
interleaved 1F1B, an uneven partition, per-block mixed plans, torchtitan's per-operator selective
checkpointing, FSDP2 under interleaved 1F1B, nanotron's buffers;
:data:`parplan.agent.matrix.EXTENDED`) on one model (the offloaded optimizer's and Megatron-LM's recompute
modules' kinds run in the full matrix; ``test_agent_offload.py`` and ``test_agent_recompute_modules.py``
run them in CI). ``PARPLAN_AGENT_MATRIX=full`` runs all 132, as
``bench/model_accuracy.py`` does;
``PARPLAN_AGENT_ONLY=a,b`` only the runs whose label contains one of those.
For every run:

- loss and gradients equal a single-process reference: ``torch.allclose(rtol=1e-4, atol=1e-6)``
  for every gradient and the step-1 loss, and the loss after one Adam step (fp32);
- measured parameters and gradients equal the prediction to the byte, optimizer states within
  Adam's 4-byte step counters (ZeRO-1: within the imbalance of ``ZeroRedundancyOptimizer``'s
  whole-tensor partition);
- the most loaded rank's measured peak is within ``TARGET`` of the predicted peak, except for
  the configurations in ``KNOWN_GAPS``: real gaps of the cost model (reported to the lead, who
  owns parplan/solver) or of the PyTorch API used, each with its diagnosis; their bound is the
  error observed plus a margin, so the test catches regressions and passes once the model is fixed;
- no run is under-predicted (measured above predicted) by more than ``UNDER`` except those in
  ``KNOWN_GAPS``: an under-prediction is a plan that does not fit, the worst error the product can make.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from parplan.agent.matrix import all_specs
from parplan.agent.validate import run_and_compare

TARGET = 0.03
UNDER = 0.02

#: label -> (bound on |relative error| of the most loaded rank's peak, diagnosis): the real gaps of
#: the cost model or of the PyTorch API used, each with its bound and reason (evidence per category in
#: bench/out/model_accuracy.txt); a bound is the error observed plus a margin, so the test catches a
#: regression and still passes once the model is fixed.
#: G15, ZeRO-3 (FSDP2) without checkpointing on gloo: gloo's worker thread drops a finished
#: collective's work, and the tensors it references, only when it is next scheduled (of 300
#: synchronous all-gathers per rank on 4 ranks, 12-19% of the outputs outlive the call:
#: bench/gloo_held_gathers.py). FSDP2's all-gather input is a slice of its output, so a held work
#: keeps a whole gathered block alive after FSDP2 frees it: with the CPU cores loaded these peaks
#: rise (run alone, 0.3% to 2% over the prediction). Holding each all-gather's tensors until the next
#: one returns (that script's emulation) gives the highest peaks measured under load (llama-tiny
#: zero3-dp4 to the byte: 36,415,656, +1,472,000 over the usual peak). How long gloo holds a work is
#: a matter of scheduling, which no rule of the model bounds: the cost model keeps FSDP2's own schedule
#: (runtime ``torch-cpu`` holds FSDP2's buffers as ``torch`` does) and each bound is the emulated
#: figure plus a margin. NCCL is not known to hold works so (FSDP2 on a GPU frees its buffers on the
#: caller's thread, stream-ordered); not measured on GPUs.
KNOWN_GAPS: dict[str, tuple[float, str]] = {
    "gpt-tiny/zero3-dp4/none": (0.05, "G15: gloo may hold a finished all-gather's output (a gathered "
                                       "block); +4.35% emulated (bench/gloo_held_gathers.py)"),
    "llama-tiny/zero3-dp4/none": (0.06, "G15: gloo may hold a finished all-gather's output (a gathered "
                                        "block); +4.84% emulated (bench/gloo_held_gathers.py)"),
    "gpt-tiny/tp2-zero3-dp2-sp/none": (0.04, "G15: gloo may hold a finished all-gather's output (a gathered "
                                             "block); +2.84% emulated (bench/gloo_held_gathers.py)"),
    "llama-tiny/tp2-zero3-dp2-sp/none": (0.045, "G15: gloo may hold a finished all-gather's output (a gathered "
                                                "block); +3.48% emulated (bench/gloo_held_gathers.py)"),
}

FULL = os.environ.get("PARPLAN_AGENT_MATRIX", "") == "full"
ONLY = [s for s in os.environ.get("PARPLAN_AGENT_ONLY", "").split(",") if s]
SPECS = [s for s in all_specs(full=FULL, timing_steps=1) if not ONLY or any(o in s.label for o in ONLY)]
LABELS = [s.label for s in SPECS]


@pytest.fixture(scope="module")
def results() -> dict[str, Any]:
    out = run_and_compare(SPECS, "cpu")
    return {s.label: r for s, r in zip(SPECS, out, strict=True)}


def _largest_tensor_elems(model: dict[str, Any]) -> int:
    from parplan.solver.frontends.builder import build_graph
    from parplan.solver.frontends.config import TransformerConfig

    graph = build_graph(TransformerConfig(**model), batch=1, seq_len=8)
    return max(n.numel for n in graph.nodes if n.is_parameter)


@pytest.mark.slow
@pytest.mark.parametrize("label", LABELS)
def test_matrix_configuration(results: dict[str, Any], label: str) -> None:
    r = results[label]
    spec = SPECS[LABELS.index(label)]
    assert [x["rank"] for x in r["ranks"]] == list(range(spec.world))
    zero1 = spec.zero == 1 and spec.dp > 1 and not spec.sharded
    # ZeroRedundancyOptimizer gives each rank whole tensors, greedily by size: a rank's share is off
    # the even 1/dp by less than the largest tensor's Adam states (two fp32 values per element).
    opt_slack = 4 * 200 + (8 * _largest_tensor_elems(spec.model) if zero1 else 0)
    # An offloaded optimizer moves whole tensors until its fraction is reached: the device keeps up to one
    # tensor's Adam states fewer than the cost model's (1 - F) (tests/agent/test_agent_offload.py).
    below = 8 * _largest_tensor_elems(spec.model) if 0 < spec.optimizer_offload < 1 else 0
    for rk in r["ranks"]:
        check = rk["check"]
        assert check["ok"], check["mismatches"]
        assert check["parameters_compared"] > 0 and not check["mismatches"]
        meas, pred = rk["measured"]["breakdown"], rk["predicted"]["breakdown"]
        assert meas["parameters"] == pred["parameters"]
        assert meas["gradients"] == pred["gradients"]
        low = (0 if not zero1 else -opt_slack) - below
        assert low <= meas["optimizer_states"] - pred["optimizer_states"] <= opt_slack
        assert meas["activations"] > 0 and meas["temporary"] > 0
        assert rk["measured"]["peak_bytes"] >= max(meas[k] for k in meas)
    assert any("loss" in rk["check"] for rk in r["ranks"])
    assert r["correct"] is True
    err = abs(r["most_loaded"]["relative_error"])
    bound, why = KNOWN_GAPS.get(label, (TARGET, ""))
    assert err <= bound, f"{label}: most loaded rank off by {err:.1%} (bound {bound:.0%}) {why}"


@pytest.mark.slow
@pytest.mark.parametrize("label", LABELS)
def test_matrix_is_never_under_predicted(results: dict[str, Any], label: str) -> None:
    """Measured above predicted by more than UNDER is a plan that may not fit; only a known gap may
    be, within its bound."""
    err = results[label]["most_loaded"]["relative_error"]
    bound, why = KNOWN_GAPS.get(label, (UNDER, ""))
    assert err <= bound, f"{label}: measured peak {err:+.1%} above the prediction (bound {bound:+.0%}) {why}"


def test_every_gap_names_a_run() -> None:
    """KNOWN_GAPS names only runs of the (full) matrix."""
    assert set(KNOWN_GAPS) <= {s.label for s in all_specs(full=True)}

"""Never dominated (issue 10, point 3): the planner's answer is never beaten on both memory and
time by a baseline or by a point of its own Pareto frontier, and ``--max-slowdown`` counts from
the fastest plan known, baselines included.

The oracle is the set of plans the answer is compared with, taken from the document itself
(baselines, the frontier) and recomputed here: a property over models, device counts, global
batches and both objectives, each answer checked against every other plan known.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from parplan.solver.planner import solve
from parplan.solver.request import parse_plan_request

#: Small Hugging Face configs (a GPT-2 and a Llama), so that every search runs in about a second.
MODELS: dict[str, dict[str, Any]] = {
    "gpt": {"model_type": "gpt2", "n_layer": 4, "n_embd": 256, "n_head": 8, "vocab_size": 2048, "n_positions": 256},
    "llama": {"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 256, "intermediate_size": 688,
              "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 2048,
              "max_position_embeddings": 256},
}


def _known(doc: dict[str, Any]) -> list[tuple[str, float, float]]:
    """(label, step seconds, peak bytes) of every plan the answer was chosen among and reports."""
    out = [(f"baseline {name}", b["time"]["step_seconds"], b["memory"]["peak_bytes"])
           for name, b in doc["baselines"].items() if b is not None and b["fits"]]
    out += [("frontier", p["step_seconds"], p["peak_bytes"]) for p in doc.get("pareto") or []]
    return out


def _check(doc: dict[str, Any], objective: str, slowdown: float, budget: int) -> None:
    known = _known(doc)
    if doc["memory"] is None:  # nothing fits: then no baseline fits either
        assert not any(peak <= budget for _, _, peak in known)
        # and the least memory the answer reports is no more than any baseline's (fitting or not)
        peaks = [b["memory"]["peak_bytes"] for b in doc["baselines"].values() if b is not None]
        if doc["least_memory_bytes"] is not None and peaks:
            assert doc["least_memory_bytes"] <= min(peaks) + 1
        return
    secs, peak = doc["time"]["step_seconds"], doc["memory"]["peak_bytes"]
    assert peak <= budget
    for label, s, p in known:
        dominates = s <= secs * (1 + 1e-9) and p <= peak + 8 and (s < secs * (1 - 1e-9) or p < peak - 8)
        assert not dominates, f"{label} ({s:.4g} s, {p} B) beats the answer ({secs:.4g} s, {peak} B)"
    documented = min([secs, *(s for _, s, _ in known)])
    fastest = doc["objective"]["fastest_known_seconds"]
    if objective == "max-throughput":
        assert fastest == pytest.approx(documented, rel=1e-9)
    else:
        # min-memory: the searches' fastest plans count too, and a min-memory search keeps only its
        # least-memory plan's document: the fastest known is at most the fastest documented, and
        # at most the search's own best time
        solver = doc["solver"]
        searched = [t for d in (solver, solver.get("chosen_over") or {}) if (t := d.get("best_time_seconds"))]
        assert fastest <= min([documented, *searched]) * (1 + 1e-9)
    if objective == "max-throughput":
        assert secs <= fastest * (1 + 1e-9)
    else:
        assert secs <= fastest * (1 + slowdown) * (1 + 1e-9)
        within = [p for _, s, p in known if s <= fastest * (1 + slowdown) * (1 + 1e-9)]
        assert peak <= min(within, default=peak) + 8


@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=st.sampled_from(sorted(MODELS)), gpus=st.sampled_from([1, 2, 4, 8, 16, 64]),
       batch=st.sampled_from(["1", "n", "4n"]), objective=st.sampled_from(["min-memory", "max-throughput"]),
       tight=st.booleans(), pareto=st.booleans())
# one device: the ILP's plan and the baselines are the same plan, priced by two paths whose step
# times differ by rounding: the answer must not be the one faster by 1e-20 s that holds 512 bytes more
@example(model="llama", gpus=1, batch="1", objective="max-throughput", tight=False, pareto=False)
# the ILP's min-memory answer runs 5e-5 over its time limit (HiGHS's row tolerance on a limit written
# in seconds): the answer must still be within the limit, not the DP's plan, 12.5% slower than the fastest
@example(model="llama", gpus=4, batch="4n", objective="min-memory", tight=False, pareto=False)
def test_the_answer_is_never_beaten_on_both_memory_and_time(model: str, gpus: int, batch: str, objective: str,
                                                            tight: bool, pareto: bool) -> None:
    global_batch = {"1": 1, "n": gpus, "4n": 4 * gpus}[batch]
    budget_gib = 0.25 if tight else None  # a tight budget makes ZeRO, recomputation and pipelines matter
    body = {"model": {"hf_config": MODELS[model]}, "cluster": {"gpus": gpus, "gpus_per_node": 8, "gpu": "A100-80GB"},
            "training": {"global_batch": global_batch, "seq_len": 256},
            "objective": {"kind": objective, "max_slowdown": 0.1, "memory_budget_gib": budget_gib},
            "search": "auto", "time_limit": 120, "pareto": pareto}
    req = parse_plan_request(body)
    _check(solve(req), objective, 0.1, req.budget_bytes)


def _solve_preset(preset: str, gpus: int, batch: int) -> tuple[Any, dict[str, Any]]:
    """The ILP's min-memory answer for a preset on A100s, checked by :func:`_check`."""
    body = {"model": {"preset": preset}, "cluster": {"gpus": gpus, "gpu": "A100-80GB"},
            "training": {"global_batch": batch}, "objective": {"kind": "min-memory", "max_slowdown": 0.1},
            "search": "ilp"}
    req = parse_plan_request(body)
    doc = solve(req)
    _check(doc, "min-memory", 0.1, req.budget_bytes)
    return req, doc


def test_bert_large_on_8_gpus_is_not_dominated_and_near_the_fastest() -> None:
    """On BERT-large over 8 GPUs the ILP's min-memory answer is beaten by no baseline on both memory
    and time, and runs within --max-slowdown 0.1 of the fastest plan known."""
    _, doc = _solve_preset("bert-large", 8, 16)
    assert doc["time"]["step_seconds"] <= 1.1 * doc["objective"]["fastest_known_seconds"] * (1 + 1e-9)


def _least_member_within(req: Any, limit: float) -> float | None:
    """Oracle: every member of every baseline family priced, no pruning; the least peak of those
    that fit and run within ``limit`` seconds."""
    from parplan.solver.baselines import BASELINES, UniformEvaluator, _family
    from parplan.solver.cost.pipeline import blocks_of

    ev = UniformEvaluator(req.model, req.cluster, req.global_batch, req.seq_len, req.calibration)
    blocks = len(blocks_of(ev.graph(1)))
    peaks = []
    for c in {c for name in BASELINES for c in _family(name, req.cluster, req.global_batch, blocks, ev.runtime)}:
        t, m = ev.time_of(c), ev.memory_of(c)
        if t is not None and m is not None and t.step_seconds <= limit and m.peak_bytes <= req.budget_bytes:
            peaks.append(m.peak_bytes)
    return min(peaks, default=None)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=st.sampled_from(sorted(MODELS)), gpus=st.sampled_from([2, 4, 8]), batch=st.sampled_from([1, 4, 8]))
def test_min_memory_is_never_beaten_by_a_slower_member_of_a_baseline_family(model: str, gpus: int,
                                                                             batch: int) -> None:
    """Each baseline is its family's fastest; the min-memory answer must also hold no more than any
    family member within the time limit (ZeRO-3 at a smaller micro-batch, say)."""
    body = {"model": {"hf_config": MODELS[model]}, "cluster": {"gpus": gpus, "gpus_per_node": 8, "gpu": "A100-80GB"},
            "training": {"global_batch": batch * gpus, "seq_len": 256},
            "objective": {"kind": "min-memory", "max_slowdown": 0.1}, "search": "ilp", "time_limit": 120}
    req = parse_plan_request(body)
    doc = solve(req)
    least = _least_member_within(req, doc["objective"]["fastest_known_seconds"] * 1.1 * (1 + 1e-9))
    # (none within the limit: the search's own plans are faster than every member's)
    assert least is None or doc["memory"]["peak_bytes"] <= least + 8


def test_gpt_1_7b_on_4_gpus_holds_no_more_than_zero3_at_a_smaller_micro_batch() -> None:
    """Found on Table 2 (batch 16, 4 A100s): the ILP answered 23.7 GiB at 0.508 s, where ZeRO-3 at
    micro-batch 2 holds 15.7 GiB at 0.466 s (the ILP's micro-step sizes skip that one, and the
    ZeRO-3 baseline is micro-batch 4, its family's fastest)."""
    req, doc = _solve_preset("gpt-1.7b", 4, 16)
    least = _least_member_within(req, doc["objective"]["fastest_known_seconds"] * 1.1 * (1 + 1e-9))
    assert least is not None and least < 17 * 2**30
    assert doc["memory"]["peak_bytes"] <= least + 8

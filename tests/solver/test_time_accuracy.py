"""The accuracy a plan shows beside its step time is the published-runs benchmark's, as the model
is now: re-running bench/time_model_accuracy.py gives the stored summary."""

from __future__ import annotations

import json
import os
import sys

from parplan.solver.calibration import DEFAULT_CALIBRATION, Calibration
from parplan.solver.cluster import make_cluster
from parplan.solver.evaluate import evaluate
from parplan.solver.models import resolve_model
from parplan.solver.strategy import ParallelConfig
from parplan.solver.time_accuracy import ACCURACY_FILE, time_accuracy

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench")


def test_stored_summary_is_the_benchmark_rerun_now() -> None:
    sys.path.insert(0, BENCH)
    try:
        import time_model_accuracy as bench
    finally:
        sys.path.remove(BENCH)
    priced, _ = bench.measure()
    rows, stand_in = bench.split(priced)
    assert len(rows) >= 20 and len({x["source"] for x in rows}) >= 4
    stored = json.loads(ACCURACY_FILE.read_text())
    assert stored == bench.summary(rows, len(stand_in)), "re-run: python bench/time_model_accuracy.py --write"


def test_a_plan_says_which_calibration_and_how_far_it_was_off() -> None:
    e = evaluate(resolve_model("gpt-1.7b"), make_cluster(8, 8, "A100-80GB"), ParallelConfig(dp=8))
    acc = e.to_dict()["time"]["accuracy"]
    stored = json.loads(ACCURACY_FILE.read_text())
    assert acc["calibration"] == "default"
    assert acc["published_runs"] == stored
    assert f"{stored['rows']} published runs" in acc["note"]


def test_a_measured_calibration_was_never_compared_with_published_runs() -> None:
    cal = Calibration(matmul_efficiency={"bf16": 0.7}, source="agent:H100-80GB@2026-11-24")
    acc = time_accuracy(cal)
    assert acc["calibration"] == cal.source
    assert acc["published_runs"] is None
    assert "never compared" in acc["note"]
    assert time_accuracy(DEFAULT_CALIBRATION)["published_runs"] is not None

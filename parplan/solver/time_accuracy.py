"""How far the step-time model was from published training runs, to show beside a predicted time.

``bench/time_model_accuracy.py --write`` prices the published runs of ``bench/data/published_runs.json``
with the default calibration and stores the summary in ``time_accuracy.json`` (next to this module):
how many runs, the geometric mean of predicted over published step time, its range, how many were
within 10%, and the commit it was measured on. A test re-runs the benchmark and fails when the
stored summary no longer matches the model. Other calibrations (measured by the agent) were never
compared with published runs: their accuracy is reported as unknown.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from parplan.solver.calibration import Calibration

ACCURACY_FILE = Path(__file__).with_name("time_accuracy.json")


@functools.lru_cache(maxsize=1)
def _published() -> dict[str, Any] | None:
    try:
        data = json.loads(ACCURACY_FILE.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def time_accuracy(calibration: Calibration) -> dict[str, Any]:
    """The ``time.accuracy`` object of a plan: the calibration its time used and that
    calibration's measured error on published runs (``published_runs``: None where unmeasured)."""
    runs = None if calibration.measured else _published()
    if runs is None:
        note = "this calibration's step times were never compared with published runs"
    else:
        note = (f"predicted / published step time over {runs['rows']} published runs: geometric mean "
                f"{runs['geometric_mean_ratio']:.2f}, {runs['min_ratio']:.2f} to {runs['max_ratio']:.2f}, "
                f"{runs['within_10_percent']} within 10%"
                + (f"; {runs['not_counted']} more, on GPUs without a preset, not counted"
                   if runs.get("not_counted") else "")
                + " (bench/RESULTS.md)")
    return {"calibration": calibration.source, "published_runs": runs, "note": note}

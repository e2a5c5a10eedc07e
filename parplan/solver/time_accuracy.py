"""How far the step-time model was from published training runs, to show beside a predicted time.

``bench/time_model_accuracy.py --write`` prices the published runs of ``bench/data/published_runs.json``
with the default calibration and stores the summary in ``time_accuracy.json`` (next to this module):
how many runs, the geometric mean of predicted over published step time, its range and how many were
within 10%, over every counted run and (``by_kind``) over the runs of each runtime on each GPU
generation. A plan's time shows both: the error varies by kind far more than the whole figure says
(Megatron-LM's runs on A100s are near 1.0, the FSDP runs on Hopper GPUs 0.7-0.9). A test re-runs the
benchmark and fails when the stored summary no longer matches the model. Other calibrations
(measured by the agent) were never compared with published runs: their accuracy is reported as
unknown.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from parplan.solver.calibration import Calibration
from parplan.solver.cluster import gpu_family

ACCURACY_FILE = Path(__file__).with_name("time_accuracy.json")


@functools.lru_cache(maxsize=1)
def _published() -> dict[str, Any] | None:
    try:
        data = json.loads(ACCURACY_FILE.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


#: GPU generations the published runs are grouped by: the same chip at another memory size or
#: clock (the H200 is an H100 with more and faster HBM) shares its kernels' efficiencies.
GENERATIONS = {"A100": "Ampere", "H100": "Hopper", "H200": "Hopper", "B200": "Blackwell", "GB200": "Blackwell"}


def gpu_generation(gpu: str) -> str:
    """The generation of a GPU preset's name (``H100-80GB`` -> ``Hopper``); a family without one
    (``V100``) is its own."""
    family = gpu_family(gpu)
    return GENERATIONS.get(family, family)


def _similar(runs: dict[str, Any], gpu: str | None, runtime: str | None) -> dict[str, Any] | None:
    if gpu is None or runtime is None:
        return None
    generation = gpu_generation(gpu)
    for kind in runs.get("by_kind") or ():
        if kind.get("generation") == generation and kind.get("runtime") == runtime:
            return dict(kind)
    return None


def time_accuracy(calibration: Calibration, gpu: str | None = None, runtime: str | None = None) -> dict[str, Any]:
    """The ``time.accuracy`` object of a plan: the calibration its time used and that
    calibration's measured error on published runs (``published_runs``: None where unmeasured), and
    on the published runs of the plan's runtime on its GPU's generation (``similar_runs``: None
    where there are none, or no GPU and runtime were given)."""
    runs = None if calibration.measured else _published()
    similar = _similar(runs, gpu, runtime) if runs is not None else None
    if runs is None:
        note = "this calibration's step times were never compared with published runs"
    else:
        note = (f"predicted / published step time over {runs['rows']} published runs: geometric mean "
                f"{runs['geometric_mean_ratio']:.2f}, {runs['min_ratio']:.2f} to {runs['max_ratio']:.2f}, "
                f"{runs['within_10_percent']} within 10%"
                + (f"; {runs['not_counted']} more, on GPUs without a preset, not counted"
                   if runs.get("not_counted") else ""))
        if similar is not None:
            note += (f"; the {similar['rows']} of runtime {runtime} on {similar['generation']} GPUs: geometric mean "
                     f"{similar['geometric_mean_ratio']:.2f}, {similar['min_ratio']:.2f} to "
                     f"{similar['max_ratio']:.2f}")
        elif gpu is not None and runtime is not None:
            note += f"; none of runtime {runtime} on {gpu_generation(gpu)} GPUs"
        note += " (bench/RESULTS.md)"
    return {"calibration": calibration.source, "published_runs": runs, "similar_runs": similar, "note": note}

"""Re-price the single-GPU runs measured on the lent H100 (bench/gpu_checks.py's ``single`` and
``large`` parts, bench/out/gpu-2026-11-23b/) with the current cost model: the step time the model
predicts now, the one it predicted when they ran, and the measured one. A time-model change that
moves these shows here.
Run: python bench/reprice_gpu_single.py
"""

from __future__ import annotations

import json
import os

from _common import header
from gpu_checks import _large_specs, _single_specs

from parplan.agent.validate import predict
from parplan.solver.cost.runtime import Runtime

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", "gpu-2026-11-23b")


def main() -> None:
    stored: dict[str, dict[str, float]] = {}
    for part in ("single.json", "large.json"):
        with open(os.path.join(OUT, part)) as f:
            stored.update({r["label"]: r["step_seconds"] for r in json.load(f)["result"]})
    print(header("Single-GPU H100 runs re-priced (fp32, runtime torch)"))
    print("| run | predicted now s | predicted then s | measured s | now / measured |")
    print("|---|---:|---:|---:|---:|")
    for spec in _single_specs() + _large_specs():
        now = predict(spec, True, gpu="H100-80GB", runtime=Runtime.TORCH)["time"]["step_seconds"]
        then = stored[spec.label]
        print(f"| {spec.label} | {now:.3f} | {then['predicted']:.3f} | {then['measured']:.3f} | "
              f"{now / then['measured']:.2f} |")


if __name__ == "__main__":
    main()

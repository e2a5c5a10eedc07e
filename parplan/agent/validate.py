"""Predicted versus measured: run a strategy locally and put the cost model's numbers beside it.

The measurement comes from the processes (:mod:`parplan.agent.executor`); the prediction is
:func:`parplan.solver.evaluate.evaluate` for the same model (the possibly shrunk copy that ran),
the same degrees, micro-batching and recomputation, in fp32, with ``flash_attention`` set from
the attention kernel the ranks actually ran and the runtime set to PyTorch's own
(:class:`~parplan.solver.cost.runtime.Runtime`, CPU or CUDA kernels as the ranks ran). Nothing
measured is derived from the prediction.
"""

from __future__ import annotations

import platform
from typing import Any

import torch

from parplan.agent.executor import RunSpec
from parplan.agent.launch import launch
from parplan.agent.memtrack import CATEGORIES
from parplan.solver.cluster import make_cluster
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.runtime import Runtime
from parplan.solver.evaluate import evaluate
from parplan.solver.models import ModelSource
from parplan.solver.strategy import ParallelConfig, Schedule

#: The cost model's categories (the measurement adds ``other``).
MODEL_CATEGORIES = CATEGORIES[:5]


def runtime_of(device_kind: str) -> Runtime:
    """The cost model's runtime for PyTorch ranks on ``device_kind`` (``cpu`` or ``cuda``)."""
    return Runtime.TORCH_CPU if device_kind == "cpu" else Runtime.TORCH


def strategy_of(spec: RunSpec, flash_attention: bool, runtime: Runtime = Runtime.TORCH_CPU) -> ParallelConfig:
    """The cost model's description of what ``spec`` runs (fp32)."""
    schedule = Schedule(spec.schedule)
    return ParallelConfig(
        tp=spec.tp, pp=spec.pp, dp=spec.dp, zero=spec.zero, sequence_parallel=spec.sequence_parallel,
        recompute=Recompute(spec.recompute), micro_batch=spec.micro_batch, num_microbatches=spec.num_microbatches,
        schedule=schedule, virtual_stages=spec.virtual_stages if schedule is Schedule.INTERLEAVED else 1,
        flash_attention=flash_attention, precision="fp32", runtime=runtime)


def uses_flash(kernel: str) -> bool:
    """Whether an attention kernel keeps no scores for backward (flash-style)."""
    return kernel not in ("unfused", "math")


def predict(spec: RunSpec, flash_attention: bool, gpu: str = "A100-80GB",
            runtime: Runtime = Runtime.TORCH_CPU) -> dict[str, Any]:
    """``evaluate(...).to_dict()`` for the configuration ``spec`` runs."""
    cfg = spec.config()
    cluster = make_cluster(spec.world, None, gpu, None)
    return evaluate(ModelSource(cfg.name, config=cfg), cluster, strategy_of(spec, flash_attention, runtime),
                    seq_len=spec.seq_len).to_dict()


def _rel(measured: float, predicted: float) -> float | None:
    if predicted == 0:
        return None if measured else 0.0
    return (measured - predicted) / predicted


def compare(spec: RunSpec, reports: list[dict[str, Any]], gpu: str = "A100-80GB") -> dict[str, Any]:
    """Per rank measured vs predicted memory, relative errors, step time, correctness."""
    kernel = reports[0]["attention_kernel"]
    runtime = runtime_of(str(reports[0].get("device", "cpu")))
    doc = predict(spec, uses_flash(kernel), gpu, runtime)
    stages = doc["memory"]["stages"]
    ranks = []
    worst = 0.0
    for r in sorted(reports, key=lambda x: x["rank"]):
        st = stages[r["stage"]]
        pred = {"peak_bytes": st["peak_bytes"], "breakdown": {k: st["breakdown"][k] for k in MODEL_CATEGORIES}}
        meas = r["measured"]
        rel = {k: _rel(meas["breakdown"][k], pred["breakdown"].get(k, 0)) for k in MODEL_CATEGORIES}
        peak_rel = _rel(meas["peak_bytes"], pred["peak_bytes"]) or 0.0
        worst = max(worst, abs(peak_rel))
        entry = {"rank": r["rank"], "stage": r["stage"], "coords": r["coords"], "measured": meas,
                 "predicted": pred, "relative_error": {"peak_bytes": peak_rel, **rel},
                 "step_seconds": r["step_seconds"]["median"]}
        if "check" in r:
            entry["check"] = r["check"]
        ranks.append(entry)
    loaded_meas = max(ranks, key=lambda x: x["measured"]["peak_bytes"])
    loaded_pred = max(ranks, key=lambda x: x["predicted"]["peak_bytes"])
    checks = [x["check"] for x in ranks if "check" in x]
    return {
        "label": spec.label,
        "config": {**config_of(spec, kernel), "runtime": runtime.value},
        "ranks": ranks,
        "max_relative_error": worst,
        "most_loaded": {
            "measured_rank": loaded_meas["rank"], "measured_peak_bytes": loaded_meas["measured"]["peak_bytes"],
            "predicted_peak_bytes": loaded_pred["predicted"]["peak_bytes"],
            "relative_error": _rel(loaded_meas["measured"]["peak_bytes"], loaded_pred["predicted"]["peak_bytes"]),
        },
        "step_seconds": {"measured": max(x["step_seconds"] for x in ranks),
                         "predicted": doc["time"]["step_seconds"]},
        "correct": all(c.get("ok", False) for c in checks) if checks else None,
        "prediction": {"memory": doc["memory"], "strategy": doc["strategy"]},
    }


def config_of(spec: RunSpec, kernel: str) -> dict[str, Any]:
    return {"model": spec.model, "tp": spec.tp, "pp": spec.pp, "dp": spec.dp, "zero": spec.zero,
            "sequence_parallel": spec.sequence_parallel, "recompute": spec.recompute,
            "micro_batch": spec.micro_batch, "num_microbatches": spec.num_microbatches,
            "schedule": spec.schedule, "virtual_stages": spec.virtual_stages, "seq_len": spec.seq_len,
            "precision": "fp32", "attention_kernel": kernel, "flash_attention": uses_flash(kernel),
            "optimizer": "torch.optim.Adam(foreach=False)", "zero_grad": "set_to_none=False"}


def run_and_compare(specs: list[RunSpec], device_kind: str = "cpu", gpu: str = "A100-80GB") -> list[dict[str, Any]]:
    """Launch specs (grouped by world size, one launch per group) and compare each."""
    out: dict[int, dict[str, Any]] = {}
    by_world: dict[int, list[int]] = {}
    for i, s in enumerate(specs):
        s.validate()
        by_world.setdefault(s.world, []).append(i)
    for world, idx in by_world.items():
        reports = launch([specs[i] for i in idx], world, device_kind)
        for i, rep in zip(idx, reports, strict=True):
            out[i] = compare(specs[i], rep, gpu)
    return [out[i] for i in range(len(specs))]


def hardware(device_kind: str = "cpu") -> dict[str, Any]:
    """What this machine is, in the protocol's ``hardware`` shape."""
    import os

    if device_kind == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        name = props.name
        mem = int(props.total_memory)
        count = torch.cuda.device_count()
    else:
        device_kind = "cpu"
        name = platform.processor() or platform.machine() or "cpu"
        try:
            mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            mem = 0
        count = os.cpu_count() or 1
    preset = gpu_preset_for(name, mem) if device_kind == "cuda" else None
    # The service applies a calibration to plans for the GPU preset its hardware key names.
    key = preset or f"{device_kind}:{name}:{count}".replace(" ", "-")[:200]
    return {"key": key, "device": device_kind, "device_name": name, "device_count": count,
            "memory_bytes": int(mem), "torch_version": torch.__version__}


def measurement_of(comparison: dict[str, Any], hardware_key: str) -> dict[str, Any]:
    """The ``measurement`` of a ``POST /v1/validations/{id}/result`` body."""
    return {
        "hardware_key": hardware_key,
        "ranks": [{"rank": r["rank"], "stage": r["stage"], "coords": r["coords"],
                   "measured": {"peak_bytes": r["measured"]["peak_bytes"],
                                "breakdown": r["measured"]["breakdown"],
                                "at_peak": r["measured"]["at_peak"]},
                   "predicted": r["predicted"], "relative_error": r["relative_error"],
                   **({"check": r["check"]} if "check" in r else {})}
                  for r in comparison["ranks"]],
        "max_relative_error": comparison["max_relative_error"],
        "step_seconds": comparison["step_seconds"],
        "correct": comparison["correct"],
        "config": comparison["config"],
    }


def gpu_preset_for(device_name: str, memory_bytes: int) -> str | None:
    """The GPU preset (``parplan.solver.cluster.GPU_PRESETS``) a CUDA device is, if any: same
    family in its name, closest memory size."""
    from parplan.solver.cluster import GPU_PRESETS

    key = device_name.upper().replace(" ", "")
    matches = [(abs(spec.memory_bytes - memory_bytes), name) for name, spec in GPU_PRESETS.items()
               if name.split("-")[0].upper() in key]
    return min(matches)[1] if matches else None

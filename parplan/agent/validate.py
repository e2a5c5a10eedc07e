"""Predicted versus measured: run a strategy locally and put the cost model's numbers beside it.

The measurement comes from the processes (:mod:`parplan.agent.executor`); the prediction is
:func:`parplan.solver.evaluate.evaluate` for the same model (the possibly shrunk copy that ran),
the same degrees, micro-batching, pipeline partition and recomputation, in fp32 (bf16 for
nanotron's buffers), with ``flash_attention`` set from the attention kernel the ranks actually ran
and the runtime set to PyTorch's own or nanotron's (:class:`~parplan.solver.cost.runtime.Runtime`,
CPU or CUDA kernels as the ranks ran). A run whose blocks differ in ZeRO stage or recomputation (as
the DP search's plans do) is predicted by the whole-plan evaluator
(:class:`~parplan.solver.cost.plan_evaluator.PlanEvaluator`) on a
:class:`~parplan.solver.cost.plan_evaluator.LayerPlan` with one strategy per block. Nothing measured
is derived from the prediction.
"""

from __future__ import annotations

import platform
from typing import Any

import torch

from parplan.agent.launch import launch
from parplan.agent.memtrack import CATEGORIES
from parplan.agent.run_spec import RunSpec
from parplan.solver.cluster import make_cluster
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.pipeline import blocks_of
from parplan.solver.cost.plan_evaluator import LayerPlan, LayerStrategy, PlanEvaluator, PlanMemory
from parplan.solver.cost.runtime import Runtime
from parplan.solver.cost.units import GraphCosts
from parplan.solver.evaluate import evaluate
from parplan.solver.models import ModelSource
from parplan.solver.strategy import ParallelConfig, Schedule

#: The cost model's categories (the measurement adds ``other``).
MODEL_CATEGORIES = CATEGORIES[:5]


def runtime_of(device_kind: str, trainer: str = "torch") -> Runtime:
    """The cost model's runtime for ranks on ``device_kind`` (``cpu`` or ``cuda``) keeping
    ``trainer``'s buffers (PyTorch's own, or nanotron's)."""
    if trainer == "nanotron":
        return Runtime.NANOTRON_CPU if device_kind == "cpu" else Runtime.NANOTRON
    return Runtime.TORCH_CPU if device_kind == "cpu" else Runtime.TORCH


def strategy_of(spec: RunSpec, flash_attention: bool, runtime: Runtime = Runtime.TORCH_CPU) -> ParallelConfig:
    """The cost model's description of what ``spec`` runs (in its precision). ``ParallelConfig`` has no
    nesting order: TP and DP nest either way with the same per-device memory, and the uniform
    evaluation assumes TP inner (links, hence time, only)."""
    schedule = Schedule(spec.schedule)
    return ParallelConfig(
        tp=spec.tp, pp=spec.pp, dp=spec.dp, zero=spec.zero, sequence_parallel=spec.sequence_parallel,
        recompute=Recompute(spec.recompute), micro_batch=spec.micro_batch, num_microbatches=spec.num_microbatches,
        schedule=schedule, virtual_stages=spec.virtual_stages if schedule.chunked else 1,
        flash_attention=flash_attention, precision=spec.precision, partition=spec.partition, runtime=runtime,
        sync_every_microbatch=spec.fsdp_sync_every_microbatch)


def layer_plan_of(spec: RunSpec, blocks: list[str], flash_attention: bool,
                  runtime: Runtime = Runtime.TORCH_CPU) -> LayerPlan:
    """The whole-plan evaluator's description of what ``spec`` runs: one strategy per block
    (``blocks``: the graph's block units in order, one per model block)."""
    st = strategy_of(spec, flash_attention, runtime)
    layers = {u: LayerStrategy(tp=spec.tp, dp=spec.dp, zero=spec.block_zero(i), sp=spec.sequence_parallel,
                               recompute=Recompute(spec.block_recompute(i)), tp_inner=spec.tp_inner)
              for i, u in enumerate(blocks)}
    return LayerPlan(pp=st.pp, num_microbatches=st.num_microbatches, global_batch=st.global_batch, layers=layers,
                     partition=st.partition, schedule=st.schedule, virtual_stages=st.virtual_stages,
                     flash_attention=flash_attention, precision=st.precision, runtime=runtime,
                     sync_every_microbatch=st.sync_every_microbatch, optimizer_offload=spec.optimizer_offload)


def _memory_doc(mem: PlanMemory) -> dict[str, Any]:
    """A :class:`PlanMemory` in the shape of ``evaluate(...).to_dict()["memory"]``."""
    peak = mem.peak_stage
    host = {"host_bytes_per_device": round(mem.host_bytes_per_device)} if mem.host_bytes_per_device else {}
    return {"peak_bytes": round(peak.peak_bytes), "peak_stage": peak.stage, **host,
            "breakdown": peak.memory.bytes.as_dict(), "redundant": peak.memory.redundant.as_dict(),
            "stages": [{"stage": st.stage, "first_unit": st.units[0] if st.units else None,
                        "last_unit": st.units[-1] if st.units else None, "peak_bytes": round(st.peak_bytes),
                        "breakdown": st.memory.bytes.as_dict(), "redundant": st.memory.redundant.as_dict(),
                        "in_flight_microbatches": st.in_flight_microbatches,
                        "activation_bytes_per_microbatch": round(st.activation_bytes_per_microbatch),
                        **({"host_bytes": round(st.host_bytes)} if host else {})}
                       for st in mem.stages]}


def predict_per_layer(spec: RunSpec, flash_attention: bool, gpu: str = "A100-80GB",
                      runtime: Runtime = Runtime.TORCH_CPU) -> dict[str, Any]:
    """Memory and step time of ``spec`` from the whole-plan evaluator (one strategy per block), in
    the shape of ``evaluate(...).to_dict()``'s ``memory``, ``time`` and ``strategy``."""
    cfg = spec.config()
    source = ModelSource(cfg.name, config=cfg)
    costs: dict[int, GraphCosts] = {}

    def costs_for(batch: int) -> GraphCosts:
        if batch not in costs:
            costs[batch] = GraphCosts(source.build(batch, spec.seq_len))
        return costs[batch]

    plan = layer_plan_of(spec, blocks_of(costs_for(spec.micro_batch).graph), flash_attention, runtime)
    ev = PlanEvaluator(costs_for, make_cluster(spec.world, None, gpu, None))
    mem, t = ev.memory(plan), ev.time(plan)
    summary = " | ".join(f"{u}: {s.describe()}" for u, s in plan.layers.items())
    return {"memory": _memory_doc(mem),
            "time": {"step_seconds": t.step_seconds, "tokens_per_second": t.tokens_per_second},
            "strategy": {"tp": spec.tp, "pp": spec.pp, "dp": spec.dp, "layers": summary,
                         "partition": list(spec.partition or []), "num_microbatches": spec.num_microbatches,
                         "micro_batch": spec.micro_batch, "schedule": plan.schedule.value,
                         "flash_attention": flash_attention, "precision": plan.precision,
                         "runtime": runtime.value, "evaluator": "PlanEvaluator"}}


def uses_flash(kernel: str) -> bool:
    """Whether an attention kernel keeps no scores for backward (flash-style)."""
    return kernel not in ("unfused", "math")


def predict(spec: RunSpec, flash_attention: bool, gpu: str = "A100-80GB",
            runtime: Runtime | None = None) -> dict[str, Any]:
    """``evaluate(...).to_dict()`` for the configuration ``spec`` runs (the whole-plan evaluator's
    :func:`predict_per_layer` when its blocks differ, or when it offloads its optimizer: the uniform
    ``ParallelConfig`` takes ``optimizer_offload`` only for the runtimes that export it, Megatron-LM and
    DeepSpeed, while the whole-plan evaluator applies the same rule, ``parplan.solver.cost.offload``, to
    the agent's own runtime); ``runtime``: by default its trainer's on CPUs."""
    runtime = runtime or runtime_of("cpu", spec.trainer)
    if spec.per_layer or spec.optimizer_offload:
        return predict_per_layer(spec, flash_attention, gpu, runtime)
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
    runtime = runtime_of(str(reports[0].get("device", "cpu")), spec.trainer)
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
        if spec.optimizer_offload:  # the offloaded optimizer's host memory (.offload)
            pred["host_bytes"] = st["host_bytes"]
            rel["host_bytes"] = _rel(meas["host"]["peak_bytes"], st["host_bytes"])
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
                         "predicted": doc["time"]["step_seconds"],
                         # several ranks on one GPU, talking through gloo: the time is no measure
                         "comparable": not any(r.get("shared_device") for r in reports)},
        "correct": all(c.get("ok", False) for c in checks) if checks else None,
        "prediction": {"memory": doc["memory"], "strategy": doc["strategy"]},
    }


def config_of(spec: RunSpec, kernel: str) -> dict[str, Any]:
    return {"model": spec.model, "tp": spec.tp, "pp": spec.pp, "dp": spec.dp, "zero": spec.zero,
            "sequence_parallel": spec.sequence_parallel, "recompute": spec.recompute,
            "micro_batch": spec.micro_batch, "num_microbatches": spec.num_microbatches,
            "schedule": spec.schedule, "virtual_stages": spec.virtual_stages, "seq_len": spec.seq_len,
            "partition": list(spec.partition) if spec.partition else None,
            "layer_zero": list(spec.layer_zero) if spec.layer_zero else None,
            "layer_recompute": list(spec.layer_recompute) if spec.layer_recompute else None,
            "tp_inner": spec.tp_inner, "fsdp_sync_every_microbatch": spec.fsdp_sync_every_microbatch,
            "precision": spec.precision, "attention_kernel": kernel, "flash_attention": uses_flash(kernel),
            "optimizer": _optimizer_name(spec), "trainer": spec.trainer, "zero_grad": "set_to_none=False",
            **({"optimizer_offload": spec.optimizer_offload} if spec.optimizer_offload else {})}


def _optimizer_name(spec: RunSpec) -> str:
    inner = (f"HostOffloadAdam(offload_fraction={spec.optimizer_offload:g})" if spec.optimizer_offload
             else "Adam(foreach=False)")
    if spec.zero == 1 and spec.dp > 1 and not spec.sharded:
        return f"ZeroRedundancyOptimizer({inner})"
    return inner if spec.optimizer_offload else f"torch.optim.{inner}"


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
    """The ``measurement`` of a ``POST /v1/validations/{id}/result`` body (with each rank's
    ``measured.contents`` where the run was diagnosed)."""
    return {
        "hardware_key": hardware_key,
        "ranks": [{"rank": r["rank"], "stage": r["stage"], "coords": r["coords"],
                   "measured": {"peak_bytes": r["measured"]["peak_bytes"],
                                "breakdown": r["measured"]["breakdown"],
                                "at_peak": r["measured"]["at_peak"],
                                **({"contents": r["measured"]["contents"]} if "contents" in r["measured"] else {}),
                                **({"host": r["measured"]["host"]} if "host" in r["measured"] else {})},
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

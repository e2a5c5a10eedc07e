"""The plan result and its document: every field of a typed result (ILP, DP, uniform, infeasible)
is read back from the document :func:`plan_document` writes, and the document holds nothing else."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from parplan.solver.frontends.presets import get_preset
from parplan.solver.models import ModelSource
from parplan.solver.planner import solve_plan
from parplan.solver.request import parse_plan_request
from parplan.solver.result import (
    IntraOperatorStrategy,
    PerLayerStrategy,
    PlanResult,
    UniformStrategy,
    plan_document,
    plan_summary,
)

TINY = get_preset("gpt-1.7b").with_(name="gpt-tiny", layers=4, hidden=128, heads=4, ffn=512, vocab=512, seq_len=64)


def _solve(**body: Any) -> PlanResult:
    request = {"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": 4, "gpus_per_node": 4},
               "training": {"global_batch": 8}, "time_limit": 120} | body
    return solve_plan(parse_plan_request(request, model=ModelSource("gpt-tiny", config=TINY)))


@pytest.fixture(scope="module", params=["ilp", "dp", "uniform", "infeasible"])
def result(request: pytest.FixtureRequest) -> PlanResult:
    if request.param == "ilp":
        return _solve(search="ilp")
    if request.param == "dp":
        return _solve(search="dp", pareto=True)
    if request.param == "uniform":
        return _solve(target="torchtitan")
    return _solve(objective={"memory_budget_gib": 0.001})


def test_the_search_gave_the_kind_of_result_asked_for(result: PlanResult) -> None:
    assert result.solver is not None
    kinds = {"ilp": IntraOperatorStrategy, "dp": PerLayerStrategy, "uniform": UniformStrategy}
    if result.solver.status == "infeasible":
        assert result.strategy is None and result.least_memory_bytes is not None
    else:
        assert any(isinstance(result.strategy, kinds[m]) for m in kinds if result.solver.method.startswith(m)) \
            or result.solver.method.startswith("baseline:"), result.solver.method


def test_every_field_is_read_back_from_the_document(result: PlanResult) -> None:
    doc = plan_document(result)
    assert json.loads(json.dumps(doc)) == doc  # JSON as it is
    back = _read_back(doc)
    assert back == _fields(result)


def test_the_document_holds_nothing_but_the_fields(result: PlanResult) -> None:
    doc = plan_document(result)
    top = {"solver", "baselines", "target", "objective", "model", "cluster"}
    top |= ({"memory", "time", "strategy", "least_memory", "least_memory_bytes", "message"} if not result.feasible
            else {"memory", "time", "strategy", "relative"})
    top |= {"pareto"} if result.pareto is not None else set()
    top |= {"categories"} if isinstance(result.strategy, IntraOperatorStrategy) else set()
    assert set(doc) == top
    assert result.solver is not None
    solver_keys = {"method", "status", "gap", "work", "seconds", "version", "why", *result.solver.details}
    solver_keys |= {"best_time_seconds"} if result.solver.best_time_seconds is not None \
        or result.solver.always_best_time else set()
    solver_keys |= {k for k in ("candidates", "note") if getattr(result.solver, k) is not None}
    solver_keys |= {"chosen_over"} if result.solver.chosen_over is not None else set()
    assert set(doc["solver"]) == solver_keys


def _fields(r: PlanResult) -> dict[str, Any]:
    """What a result says, field by field (numbers as the document rounds them)."""
    assert r.solver is not None and r.model is not None and r.cluster is not None and r.objective is not None
    assert r.baselines is not None and r.target is not None
    out: dict[str, Any] = {
        "solver": {"method": r.solver.method, "status": r.solver.status, "gap": r.solver.gap,
                   "best_time_seconds": r.solver.best_time_seconds, "work": dict(r.solver.work or {}),
                   "details": dict(r.solver.details), "version": r.solver.version, "why": r.solver.why},
        "model": (r.model.name, r.model.parameters, r.model.seq_len, r.model.architecture),
        "cluster": (r.cluster.num_devices, r.cluster.gpus_per_node, r.cluster.gpu.name, r.cluster.device_memory_bytes),
        "objective": dataclasses.astuple(r.objective),
        "target": (r.target.name, r.target.runtime, r.target.baseline, list(r.target.unpriced)),
        "baselines": {n: None if e is None else (round(e.memory.peak_bytes), e.time.step_seconds, e.fits,
                                                 e.strategy.describe()) for n, e in r.baselines.items()},
        "pareto": None if r.pareto is None else [(p.step_seconds, round(p.peak_bytes), p.summary) for p in r.pareto],
    }
    if r.memory is None or r.time is None or r.strategy is None:
        assert r.least_memory_bytes is not None
        out["infeasible"] = (round(r.least_memory_bytes), r.message)
        return out
    m, t = r.memory, r.time
    out["memory"] = (round(m.peak_bytes), m.fits, m.device_memory_bytes, m.breakdown.as_dict(), m.redundant.as_dict(),
                     m.peak_stage, None if m.budget_bytes is None else round(m.budget_bytes),
                     None if m.stages is None else [round(s.peak_bytes) for s in m.stages.stages])
    out["time"] = (t.step_seconds, t.tokens_per_second, t.samples_per_second, t.calibration, t.accuracy,
                   t.bubble_fraction, None if t.stages is None else [s.forward_seconds for s in t.stages.stages])
    s = r.strategy
    if isinstance(s, UniformStrategy):
        c = s.config
        out["strategy"] = ("uniform", c.describe(), c.tp, c.pp, c.dp, c.zero, c.micro_batch, c.num_microbatches)
    elif isinstance(s, PerLayerStrategy):
        p = s.plan
        out["strategy"] = ("per-layer", plan_summary(p), p.pp, p.num_microbatches, list(p.partition or []),
                           len(p.layers))
    else:
        out["strategy"] = ("intra-operator", s.summary, dict(s.mesh_axes), s.micro_step_batch, s.num_microbatches,
                           [(u.units, u.count, u.representative, {o.op: o.strategy for o in u.ops}) for u in s.units])
    return out


def _read_back(doc: dict[str, Any]) -> dict[str, Any]:
    """The same fields, read from the document alone."""
    sv = doc["solver"]
    common = {"method", "status", "gap", "best_time_seconds", "work", "seconds", "version", "why", "candidates",
              "note", "chosen_over"}
    out: dict[str, Any] = {
        "solver": {"method": sv["method"], "status": sv["status"], "gap": sv["gap"],
                   "best_time_seconds": sv.get("best_time_seconds"), "work": sv["work"],
                   "details": {k: v for k, v in sv.items() if k not in common}, "version": sv["version"],
                   "why": sv["why"]},
        "model": (doc["model"]["name"], doc["model"]["parameters"], doc["model"]["seq_len"],
                  doc["model"].get("architecture")),
        "cluster": tuple(doc["cluster"][k] for k in ("gpus", "gpus_per_node", "gpu", "device_memory_bytes")),
        "objective": tuple(doc["objective"][k] for k in ("kind", "alpha", "max_slowdown", "memory_budget_bytes",
                                                         "fastest_known_seconds")),
        "target": tuple(doc["target"][k] for k in ("name", "runtime", "baseline", "unpriced")),
        "baselines": {n: None if b is None else (b["memory"]["peak_bytes"], b["time"]["step_seconds"], b["fits"],
                                                 b["strategy"]["summary"]) for n, b in doc["baselines"].items()},
        "pareto": None if "pareto" not in doc else [(p["step_seconds"], p["peak_bytes"], p["summary"])
                                                    for p in doc["pareto"]],
    }
    if doc["memory"] is None:
        out["infeasible"] = (doc["least_memory_bytes"], doc["message"])
        return out
    m, t, s = doc["memory"], doc["time"], doc["strategy"]
    out["memory"] = (m["peak_bytes"], m["fits"], m["device_memory_bytes"], m["breakdown"], m["redundant"],
                     m.get("peak_stage"), m.get("budget_bytes"),
                     [st["peak_bytes"] for st in m["stages"]] if "stages" in m else None)
    out["time"] = (t["step_seconds"], t["tokens_per_second"], t["samples_per_second"], t["calibration"],
                   t["accuracy"], t.get("bubble_fraction"),
                   [st["forward_seconds"] for st in t["stages"]] if "stages" in t else None)
    if s["kind"] == "uniform":
        out["strategy"] = ("uniform", s["summary"], s["tp"], s["pp"], s["dp"], s["zero"], s["micro_batch"],
                           s["num_microbatches"])
    elif s["kind"] == "per-layer":
        out["strategy"] = ("per-layer", s["summary"], s["pp"], s["num_microbatches"], s["partition"],
                           sum(run["count"] for run in s["layers"]))
    else:
        out["strategy"] = ("intra-operator", s["summary"], s["mesh"]["axes"], s["micro_step_batch"],
                           s["num_microbatches"], [(u["units"], u["count"], u["representative"],
                                                    {op: info["strategy"] for op, info in u["ops"].items()})
                                                   for u in s["units"]])
    return out

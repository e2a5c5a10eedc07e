"""The result documents of capacity sweeps and replans (JSON at the edge; the decisions are the
solver library's :mod:`parplan.solver.capacity` and :mod:`parplan.solver.replan`)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from sqlalchemy.orm import Session

from parplan.service.capacity import service
from parplan.service.capacity.repository import SweepRepository
from parplan.service.models import Job, Sweep
from parplan.service.problems import NotFoundError, parse_id
from parplan.solver import replan
from parplan.solver.capacity import Cell, summarise


def cell_json(c: Cell) -> dict[str, Any]:
    o = c.outcome
    return {"gpu": o.gpu, "gpus": o.gpus, "plan_id": o.plan_id, "fits": o.fits, "step_seconds": o.step_seconds,
            "tokens_per_second": o.tokens_per_second, "scaling_efficiency": c.scaling_efficiency,
            "time_to_train_hours": c.time_to_train_hours, "cost": c.cost, "status": o.status, "error": o.error}


def get_sweep(session: Session, text: str, kind: str) -> tuple[Sweep, Job]:
    sweep = SweepRepository(session).get(parse_id(text, kind))
    job = session.get(Job, sweep.job_id) if sweep is not None else None
    if sweep is None or job is None or sweep.kind != kind:
        raise NotFoundError(f"no {kind} {text}")
    return sweep, job


def _note(goal_met: bool | None, goal: Mapping[str, Any] | None) -> str | None:
    if goal_met is not False or not goal:
        return None
    asked = " and ".join(f"{k} {v:g}" for k, v in goal.items() if v is not None)
    return f"no allocation meets the goal ({asked}): no cell that fits trains within it"


def capacity_document(session: Session, sweep_id: str) -> dict[str, Any]:
    """The capacity result as it stands (``complete`` false while cells are pending)."""
    sweep, job = get_sweep(session, sweep_id, "capacity")
    req = sweep.request
    rows = SweepRepository(session).cells(sweep.job_id)
    s = summarise(service.pools_of(req), [service.outcome(r) for r in rows], float(req["training"]["tokens"]),
                  service.goal_of(req))
    return {"id": str(job.id), "status": job.status, "complete": s.complete,
            "cells": [cell_json(c) for c in s.cells],
            "fewest_gpus_that_fit": dict(s.fewest_gpus_that_fit),
            "cheapest_meeting_deadline": cell_json(s.cheapest_meeting_deadline) if s.cheapest_meeting_deadline
            else None,
            "fastest_within_budget": cell_json(s.fastest_within_budget) if s.fastest_within_budget else None,
            "frontier": [cell_json(c) for c in s.frontier], "goal": req.get("goal"), "goal_met": s.goal_met,
            "note": _note(s.goal_met, req.get("goal"))}


def replan_document(session: Session, sweep_id: str) -> dict[str, Any]:
    """The replan result: the new plan (when its cell is answered), whether the target's
    checkpoint resumes into it and why not, and the switch's cost."""
    sweep, job = get_sweep(session, sweep_id, "replan")
    req = sweep.request
    repo = SweepRepository(session)
    row = repo.cells(sweep.job_id)[0]
    cell = service.outcome(row)
    old = repo.plan_document(uuid.UUID(req["plan_id"]))
    assert old is not None
    old_doc = old[1]
    rule = replan.rule_for(str(req["target"]), bool(req["reshardable_optimizer"]))
    out: dict[str, Any] = {
        "id": str(job.id), "status": job.status, "complete": cell.status != "pending",
        "from_plan_id": req["plan_id"], "gpus_before": req["gpus_before"], "gpus": row.gpus, "gpu": row.gpu,
        "target": req["target"], "plan_id": cell.plan_id, "cell_status": cell.status,
        "fits": cell.fits, "step_seconds": cell.step_seconds, "tokens_per_second": cell.tokens_per_second,
        "rule": _rule_json(rule), "changes": None, "resumable": None, "reasons": [], "switch_cost": None}
    if cell.status in ("unsolvable", "failed", "cancelled"):
        out["resumable"] = False
        out["reasons"] = [f"no plan on {row.gpus} {row.gpu}: {cell.error or cell.status}"]
        return out
    if cell.status != "done" or cell.plan_id is None:
        return out
    new = repo.plan_document(uuid.UUID(cell.plan_id))
    assert new is not None
    if not cell.fits:
        solver = new[1].get("solver") or {}
        out["resumable"] = False
        out["reasons"] = [f"no plan on {row.gpus} {row.gpu} fits: the search found {solver.get('status')} "
                          f"over {solver.get('candidates')} candidates ({solver.get('why')})"]
        return out
    before, after = replan.layout_of(old_doc), replan.layout_of(new[1])
    changed = replan.changes(before, after)
    out["changes"] = None if changed is None else {c.axis: {"before": list(c.before), "after": list(c.after)}
                                                   for c in changed}
    if rule is not None:
        out["reasons"] = list(replan.blocked(rule, before, after))
        out["resumable"] = not out["reasons"]
    else:
        out["reasons"] = [f"target {req['target']} names no checkpoint format; nothing was checked"]
    cost = replan.switch_cost(float((old_doc.get("model") or {}).get("parameters") or 0), rule,
                              float(req["storage_gb_per_second"]) * 1e9,
                              float((old_doc.get("time") or {}).get("step_seconds") or 0.0),
                              int(req["checkpoint_interval_steps"]), planned=req.get("nodes_lost") is None)
    out["switch_cost"] = {"checkpoint_bytes": cost.checkpoint_bytes, "save_seconds": cost.save_seconds,
                          "load_seconds": cost.load_seconds, "lost_steps": cost.lost_steps,
                          "lost_seconds": cost.lost_seconds, "total_seconds": cost.total_seconds}
    return out


def _rule_json(rule: replan.ResumeRule | None) -> dict[str, Any] | None:
    if rule is None:
        return None
    return {"target": rule.target, "checkpoint": rule.checkpoint, "reshards": sorted(rule.reshards),
            "source": rule.source}

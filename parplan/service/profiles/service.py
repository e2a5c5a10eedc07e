"""Profiling data: store it; pick out calibrations for the planner."""

from __future__ import annotations

import math
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from parplan.service.agents.service import owned_agent
from parplan.service.auth.service import Principal
from parplan.service.database import new_id, utcnow
from parplan.service.models import Profile
from parplan.service.problems import InvalidError, field_error
from parplan.service.profiles.repository import ProfileRepository
from parplan.service.profiles.schemas import ProfileIn
from parplan.solver.calibration import Calibration
from parplan.solver.cluster import gpu_preset
from parplan.solver.errors import SolverError


def gpu_for(hardware_key: str) -> str | None:
    """The GPU preset a hardware key names (``h100`` → ``H100-80GB``), or None."""
    try:
        return gpu_preset(hardware_key).name
    except SolverError:
        return None


def _calibration(data: dict[str, Any], hardware_key: str, now: datetime) -> dict[str, Any] | None:
    raw = data.get("calibration")
    if raw is None:
        return None
    try:
        cal = Calibration.from_dict(raw)
    except SolverError as e:
        raise InvalidError(f"data.calibration: {e}", [field_error(["body", "data", "calibration"], str(e))]) from None
    doc = cal.to_dict()
    if doc.get("source") in (None, "", "default"):
        doc["source"] = f"agent:{hardware_key}@{now.strftime('%Y-%m-%dT%H:%M:%SZ')}"
    return doc


def create(session: Session, payload: ProfileIn, principal: Principal, *,
           validation_id: uuid.UUID | None = None) -> Profile:
    if payload.agent_id is not None:
        owned_agent(session, payload.agent_id, principal)
    now = utcnow()
    cal = _calibration(payload.data, payload.hardware_key, now) if payload.kind == "microbenchmark" else None
    return ProfileRepository(session).add(Profile(
        id=new_id(), hardware_key=payload.hardware_key, gpu=gpu_for(payload.hardware_key), kind=payload.kind,
        data=payload.data, calibration=cal, agent_id=payload.agent_id, validation_id=validation_id,
        created_at=now))


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
        return None
    return float(x)


def _obj(x: Any) -> dict[str, Any]:
    return x if isinstance(x, dict) else {}


def compare(measurement: dict[str, Any]) -> dict[str, Any]:
    """Measured vs predicted bytes per category and rank, with relative errors, from a validation
    measurement (``ranks[].measured``/``predicted`` with ``peak_bytes`` and ``breakdown``)."""
    categories: dict[str, list[dict[str, Any]]] = {}
    ranks = measurement.get("ranks")
    for r in ranks if isinstance(ranks, list) else []:
        if not isinstance(r, dict):
            continue
        meas, pred = _obj(r.get("measured")), _obj(r.get("predicted"))
        mb, pb = _obj(meas.get("breakdown")), _obj(pred.get("breakdown"))
        pairs = {cat: (mb.get(cat), pb.get(cat)) for cat in sorted(set(mb) | set(pb))}
        pairs["peak_bytes"] = (meas.get("peak_bytes"), pred.get("peak_bytes"))
        for cat, (m, p) in pairs.items():
            mv, pv = _num(m), _num(p)
            if mv is None and pv is None:
                continue
            rel = (pv - mv) / mv if mv and pv is not None else None
            categories.setdefault(cat, []).append({"rank": r.get("rank"), "measured": mv, "predicted": pv,
                                                   "relative_error": rel})
    return {"categories": categories, "max_relative_error": _num(measurement.get("max_relative_error"))}

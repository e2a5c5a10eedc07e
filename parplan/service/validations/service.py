"""Validations: queue one for a plan, let an agent claim it, store its result as profiling data."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy.orm import Session

from parplan.service.agents.repository import AgentRepository
from parplan.service.agents.service import owned_agent
from parplan.service.auth.service import Principal
from parplan.service.database import new_id, utcnow
from parplan.service.models import Validation, ValidationStatus
from parplan.service.plans.repository import PlanRepository
from parplan.service.plans.service import get_plan, plan_out
from parplan.service.problems import ConflictError, get_or_404
from parplan.service.profiles import service as profiles
from parplan.service.profiles.schemas import ProfileIn
from parplan.service.validations.repository import ValidationRepository
from parplan.service.validations.schemas import ResultIn, Shrink, validation_out


def create(session: Session, plan_id: str, shrink: Shrink | None) -> Validation:
    plan = get_plan(session, plan_id)
    return ValidationRepository(session).add(Validation(
        id=new_id(), plan_id=plan.id, status=ValidationStatus.QUEUED.value,
        shrink=shrink.model_dump() if shrink else None, created_at=utcnow()))


def get(session: Session, validation_id: str) -> Validation:
    return get_or_404(ValidationRepository(session).get, validation_id, "validation")


def claim_once(session: Session, agent_id: uuid.UUID, principal: Principal, *, beat: bool) -> dict[str, Any] | None:
    """Claim the oldest queued validation for the agent: its JSON with the plan and request, or None."""
    agent = owned_agent(session, agent_id, principal)
    now = utcnow()
    if beat:
        AgentRepository(session).heartbeat(agent.id, now)
    v = ValidationRepository(session).claim_next(agent.id, now)
    if v is None:
        return None
    plan = PlanRepository(session).get(v.plan_id)
    assert plan is not None  # foreign key
    return {**validation_out(v), "plan": plan_out(plan), "request": plan.request}


def record_result(session: Session, validation_id: str, payload: ResultIn, principal: Principal) -> Validation:
    """Close a running validation the agent holds and store its measurement as a profile.
    Posting the same outcome again is a no-op (200); a different one after the fact is 409."""
    v = get(session, validation_id)
    agent = owned_agent(session, payload.agent_id, principal)
    now = utcnow()
    AgentRepository(session).heartbeat(agent.id, now)
    if v.status in (ValidationStatus.SUCCEEDED.value, ValidationStatus.FAILED.value):
        if v.agent_id == agent.id and v.status == payload.status:
            return v
        raise ConflictError(f"validation {v.id} already {v.status}")
    if v.status != ValidationStatus.RUNNING.value or v.agent_id != agent.id:
        raise ConflictError(f"validation {v.id} is not held by agent {agent.id} (status {v.status}); claim it first")
    status = ValidationStatus(payload.status)
    result: dict[str, Any] | None = None
    if payload.measurement is not None:
        result = {"measurement": payload.measurement, **profiles.compare(payload.measurement)}
    if not ValidationRepository(session).finish(v.id, agent.id, status, result, payload.error, now):
        raise ConflictError(f"validation {v.id} changed hands meanwhile")
    if payload.measurement is not None:
        key = payload.measurement.get("hardware_key")
        profiles.create(session, ProfileIn(
            hardware_key=key if isinstance(key, str) and key else agent.hardware_key, kind="validation",
            data={"validation_id": str(v.id), "plan_id": str(v.plan_id), "status": status.value, **(result or {})},
            agent_id=agent.id), principal, validation_id=v.id)
    session.refresh(v)
    return v

"""All queries on ``validations``."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from parplan.service.models import Agent, Validation, ValidationStatus

Q, R = ValidationStatus.QUEUED.value, ValidationStatus.RUNNING.value


class ValidationRepository:
    def __init__(self, session: Session) -> None:
        self.session = session

    def get(self, validation_id: uuid.UUID) -> Validation | None:
        return self.session.get(Validation, validation_id)

    def add(self, v: Validation) -> Validation:
        self.session.add(v)
        self.session.flush()
        return v

    def claim_next(self, agent_id: uuid.UUID, now: datetime, tries: int = 5) -> Validation | None:
        """Take the oldest queued validation for ``agent_id`` (conditional UPDATE; retried when
        another agent took the candidate first)."""
        for _ in range(tries):
            cand = self.session.scalar(select(Validation.id).where(Validation.status == Q)
                                       .order_by(Validation.created_at, Validation.id).limit(1))
            if cand is None:
                return None
            res = self.session.execute(
                update(Validation).where(Validation.id == cand, Validation.status == Q)
                .values(status=R, agent_id=agent_id, claimed_at=now, attempts=Validation.attempts + 1)
                .execution_options(synchronize_session=False))
            if getattr(res, "rowcount", 0) == 1:
                v = self.get(cand)
                if v is not None:
                    self.session.refresh(v)
                return v
        return None

    def finish(self, validation_id: uuid.UUID, agent_id: uuid.UUID, status: ValidationStatus,
               result: dict[str, object] | None, error: str | None, now: datetime) -> bool:
        res = self.session.execute(
            update(Validation).where(Validation.id == validation_id, Validation.agent_id == agent_id,
                                     Validation.status == R)
            .values(status=status.value, result=result, error=error, finished_at=now)
            .execution_options(synchronize_session=False))
        return getattr(res, "rowcount", 0) == 1

    def abandoned(self, heartbeat_before: datetime, limit: int = 500) -> list[Validation]:
        """Running validations whose agent has not sent a heartbeat since ``heartbeat_before``."""
        stmt = (select(Validation).outerjoin(Agent, Agent.id == Validation.agent_id)
                .where(Validation.status == R,
                       (Agent.last_heartbeat_at < heartbeat_before) | Agent.id.is_(None))
                .limit(limit))
        return list(self.session.scalars(stmt))

    def requeue(self, validation_id: uuid.UUID, agent_id: uuid.UUID | None) -> bool:
        cond = [Validation.id == validation_id, Validation.status == R]
        cond.append(Validation.agent_id == agent_id if agent_id is not None else Validation.agent_id.is_(None))
        res = self.session.execute(update(Validation).where(*cond)
                                   .values(status=Q, agent_id=None, claimed_at=None)
                                   .execution_options(synchronize_session=False))
        return getattr(res, "rowcount", 0) == 1

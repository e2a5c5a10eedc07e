"""All queries on ``sweeps`` and ``sweep_cells`` (and the cells' jobs and plans, read together)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from parplan.service.models import Job, JobStatus, Plan, Sweep, SweepCell

ACTIVE = (JobStatus.QUEUED.value, JobStatus.RUNNING.value)


@dataclass(frozen=True)
class CellRow:
    """A cell with its plan job's state and, when solved, the few plan figures a sweep reads."""

    idx: int
    gpu: str
    gpus: int
    job_id: uuid.UUID
    status: str
    plan_id: uuid.UUID | None
    error: dict[str, Any] | None
    fits: bool | None
    step_seconds: float | None
    tokens_per_second: float | None


class SweepRepository:
    def __init__(self, session: Session) -> None:
        self.session = session

    def add(self, sweep: Sweep, cells: Sequence[SweepCell]) -> None:
        self.session.add(sweep)
        self.session.flush()
        self.session.add_all(list(cells))
        self.session.flush()

    def get(self, job_id: uuid.UUID) -> Sweep | None:
        return self.session.get(Sweep, job_id)

    def cells(self, sweep_id: uuid.UUID) -> list[CellRow]:
        """Every cell in order, read with its job and plan in one query (the plan's figures are
        read inside its JSON document, never the whole document)."""
        doc = Plan.document
        stmt = (select(SweepCell.idx, SweepCell.gpu, SweepCell.gpus, SweepCell.job_id, Job.status, Job.plan_id,
                       Job.error, doc["memory"]["fits"].as_boolean(), doc["time"]["step_seconds"].as_float(),
                       doc["time"]["tokens_per_second"].as_float())
                .join(Job, Job.id == SweepCell.job_id).outerjoin(Plan, Plan.id == Job.plan_id)
                .where(SweepCell.sweep_id == sweep_id).order_by(SweepCell.idx))
        return [CellRow(*row) for row in self.session.execute(stmt)]

    def sweeps_of(self, cell_job_id: uuid.UUID) -> list[uuid.UUID]:
        """The running sweeps with a cell answered by job ``cell_job_id``."""
        stmt = (select(SweepCell.sweep_id).join(Job, Job.id == SweepCell.sweep_id)
                .where(SweepCell.job_id == cell_job_id, Job.status == JobStatus.RUNNING.value).distinct())
        return list(self.session.scalars(stmt))

    def running(self, limit: int = 200) -> list[uuid.UUID]:
        """Sweeps whose job is still running, oldest first."""
        stmt = (select(Sweep.job_id).join(Job, Job.id == Sweep.job_id)
                .where(Job.status == JobStatus.RUNNING.value).order_by(Job.created_at).limit(limit))
        return list(self.session.scalars(stmt))

    def owned_active_cells(self, sweep_id: uuid.UUID) -> list[uuid.UUID]:
        """The queued or running plan jobs this sweep created (cancelling it cancels them)."""
        stmt = (select(SweepCell.job_id).join(Job, Job.id == SweepCell.job_id)
                .where(SweepCell.sweep_id == sweep_id, SweepCell.owned.is_(True), Job.status.in_(ACTIVE)))
        return list(self.session.scalars(stmt))

    def plan_document(self, plan_id: uuid.UUID) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """A plan's request and document."""
        plan = self.session.get(Plan, plan_id)
        return None if plan is None else (plan.request, plan.document)

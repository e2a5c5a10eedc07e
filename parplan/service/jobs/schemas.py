"""Wire shapes of jobs."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from parplan.service.models import Job

StatusName = Literal["queued", "running", "succeeded", "failed", "cancelled"]


class Progress(BaseModel):
    stage: str | None = Field(description="Solver stage: starting, building, baselines, search, done, ...")
    fraction: float = Field(ge=0, le=1)


class JobError(BaseModel):
    code: str = Field(description="unsolvable | internal | timeout | worker-lost | cancelled")
    type: str
    message: str


class JobOut(BaseModel):
    id: uuid.UUID
    status: StatusName
    progress: Progress
    plan_id: uuid.UUID | None
    error: JobError | None
    attempts: int
    cancel_requested: bool
    request_hash: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime
    url: str
    kind: Literal["plan", "capacity", "replan"] = "plan"
    result_url: str | None = Field(default=None, description="Finished with a result: the plan "
                                   "(/v1/plans/{id}), the capacity result or the replan result.")


class JobEnvelope(BaseModel):
    job: JobOut


class JobPage(BaseModel):
    jobs: list[JobOut]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page; null on the last.")


def job_out(job: Job) -> dict[str, Any]:
    """The JSON form of a job (dict: cheap to build on hot paths)."""
    return {
        "id": str(job.id), "status": job.status,
        "progress": {"stage": job.progress_stage, "fraction": job.progress_fraction},
        "plan_id": str(job.plan_id) if job.plan_id else None, "error": job.error, "attempts": job.attempts,
        "cancel_requested": job.cancel_requested, "request_hash": job.request_hash,
        "created_at": job.created_at.isoformat(),
        "started_at": job.started_at.isoformat() if job.started_at else None,
        "finished_at": job.finished_at.isoformat() if job.finished_at else None,
        "updated_at": job.updated_at.isoformat(), "url": f"/v1/jobs/{job.id}",
        "kind": job.kind or "plan", "result_url": result_url(job),
    }


def result_url(job: Job) -> str | None:
    """Where a succeeded job's result is: its plan, or its sweep's result document."""
    if job.status != "succeeded":
        return None
    if job.kind in ("capacity", "replan"):
        return f"/v1/{job.kind}/{job.id}"
    return f"/v1/plans/{job.plan_id}" if job.plan_id else None

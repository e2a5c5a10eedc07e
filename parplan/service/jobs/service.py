"""Jobs: read, list, cancel."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy.orm import Session

from parplan.service.database import utcnow
from parplan.service.jobs.repository import JobRepository
from parplan.service.models import Job, JobStatus
from parplan.service.problems import ConflictError, get_or_404


def get_job(session: Session, job_id: str) -> Job:
    return get_or_404(JobRepository(session).get, job_id, "job")


def list_jobs(session: Session, statuses: list[JobStatus] | None, cursor: str | None,
              limit: int) -> tuple[list[Job], str | None]:
    return JobRepository(session).list_page([s.value for s in statuses] if statuses else None, cursor, limit)


def request_summaries(session: Session, jobs: list[Job]) -> dict[uuid.UUID, dict[str, Any]]:
    """What the dashboard's job table shows of each job's request; ``cached``: the job succeeded
    with a plan solved before or meanwhile (it ran no solve of its own)."""
    out = JobRepository(session).request_summaries([j.id for j in jobs]) if jobs else {}
    for j in jobs:
        if j.id in out:
            out[j.id]["cached"] = j.status == JobStatus.SUCCEEDED.value and out[j.id]["solve_seconds"] is None
    return out


def cancel_job(session: Session, job_id: str) -> Job:
    """Queued: cancelled now. Running: flagged, and its worker stops the solve within about a
    second (the job then reads ``cancelled``). Finished: 409."""
    job = get_job(session, job_id)
    if JobStatus(job.status).terminal:
        raise ConflictError(f"job {job.id} already {job.status}; nothing to cancel")
    repo = JobRepository(session)
    if job.kind in ("capacity", "replan"):  # a sweep: its cells, then its job
        from parplan.service.capacity.service import cancel

        cancel(session, job)
        return repo.refresh(job)
    repo.request_cancel(job.id, utcnow())
    return repo.refresh(job)

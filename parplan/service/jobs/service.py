"""Jobs: read, list, cancel."""

from __future__ import annotations

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


def cancel_job(session: Session, job_id: str) -> Job:
    """Queued: cancelled now. Running: flagged, and its worker stops the solve within about a
    second (the job then reads ``cancelled``). Finished: 409."""
    job = get_job(session, job_id)
    if JobStatus(job.status).terminal:
        raise ConflictError(f"job {job.id} already {job.status}; nothing to cancel")
    repo = JobRepository(session)
    repo.request_cancel(job.id, utcnow())
    return repo.refresh(job)

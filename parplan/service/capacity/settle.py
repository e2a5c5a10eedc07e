"""Settling a sweep (a capacity sweep or a replan): its progress counts the cells answered, one
event each, and its job ends when every cell has. Called by the worker that ended a cell
(:mod:`parplan.workers.sweeps`), by the sweeper, and at submission (every cell cached)."""

from __future__ import annotations

import uuid

from sqlalchemy.orm import Session

from parplan.service.capacity.repository import SweepRepository
from parplan.service.database import utcnow
from parplan.service.jobs.repository import JobRepository
from parplan.service.models import JobStatus

_TERMINAL = {s.value for s in JobStatus if s.terminal}


def settle(session: Session, sweep_id: uuid.UUID) -> bool:
    """Record the sweep's progress (cells answered); end its job when every cell has. True when
    this call ended it."""
    rows = SweepRepository(session).cells(sweep_id)
    done = sum(r.status in _TERMINAL for r in rows)
    jobs = JobRepository(session)
    if done == len(rows):
        return jobs.close_sweep(sweep_id, JobStatus.SUCCEEDED, utcnow())
    jobs.sweep_progress(sweep_id, f"{done}/{len(rows)} cells", done / max(1, len(rows)), utcnow())
    return False


def settle_sweeps_of(session: Session, cell_job_id: uuid.UUID) -> list[uuid.UUID]:
    """Settle every running sweep with a cell answered by job ``cell_job_id``; those ended."""
    return [s for s in SweepRepository(session).sweeps_of(cell_job_id) if settle(session, s)]


def settle_running(session: Session) -> int:
    """The sweeper's pass: settle every running sweep (a cell may have ended with no worker to
    tell its sweep: failed by the sweeper, or its worker killed after storing it)."""
    return sum(settle(session, s) for s in SweepRepository(session).running())

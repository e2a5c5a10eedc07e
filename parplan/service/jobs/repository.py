"""All queries on ``jobs`` and ``job_events``. State changes are conditional UPDATEs, so two workers
(or a worker and the sweeper) racing on one job can never both win: the loser's statement matches
no row. Every change a watcher sees (status, progress, the cancel flag) also adds a ``job_events``
row in the same transaction, after the UPDATE locked the job's row."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Integer, case, func, literal, select, text, update
from sqlalchemy.orm import Session, undefer

from parplan.service.jobs.schemas import job_out
from parplan.service.models import Job, JobEvent, JobStatus
from parplan.service.pagination import next_cursor, page

Q, R = JobStatus.QUEUED.value, JobStatus.RUNNING.value
#: The advisory lock key that serialises job admissions (an arbitrary constant: "parplan" in ASCII).
SUBMISSIONS_LOCK = int.from_bytes(b"parplan", "big")


@dataclass(frozen=True)
class Lease:
    """What a worker learns when it renews its lease: whether it still owns the job, and
    whether a client asked to cancel it."""

    owned: bool
    cancel_requested: bool


class JobRepository:
    def __init__(self, session: Session) -> None:
        self.session = session

    # -- reads ----------------------------------------------------------------------------------
    def get(self, job_id: uuid.UUID) -> Job | None:
        return self.session.get(Job, job_id)

    def refresh(self, job: Job) -> Job:
        self.session.refresh(job)
        return job

    def events_after(self, job_id: uuid.UUID, after: int, limit: int = 200) -> list[tuple[int, dict[str, Any]]]:
        """The job's events with an id above ``after``, oldest first: ``(id, job document)``."""
        stmt = (select(JobEvent.id, JobEvent.document).where(JobEvent.job_id == job_id, JobEvent.id > after)
                .order_by(JobEvent.id).limit(limit))
        return [(int(i), d) for i, d in self.session.execute(stmt)]

    def last_event(self, job_id: uuid.UUID) -> tuple[int, dict[str, Any]] | None:
        stmt = (select(JobEvent.id, JobEvent.document).where(JobEvent.job_id == job_id)
                .order_by(JobEvent.id.desc()).limit(1))
        row = self.session.execute(stmt).first()
        return (int(row[0]), row[1]) if row is not None else None

    def active_for_key(self, cache_key: str) -> Job | None:
        stmt = (select(Job).where(Job.cache_key == cache_key, Job.status.in_((Q, R)), Job.cancel_requested.is_(False))
                .order_by(Job.created_at).limit(1))
        return self.session.scalars(stmt).first()

    def producer_of(self, plan_id: uuid.UUID) -> Job | None:
        stmt = select(Job).where(Job.plan_id == plan_id).order_by(Job.created_at).limit(1)
        return self.session.scalars(stmt).first()

    def list_page(self, statuses: Sequence[str] | None, cursor: str | None, limit: int) -> tuple[list[Job], str | None]:
        stmt = select(Job)
        if statuses:
            stmt = stmt.where(Job.status.in_(list(statuses)))
        rows = list(self.session.scalars(page(stmt, Job.created_at, Job.id, cursor, limit)))
        return next_cursor(rows, limit)

    def request_summaries(self, job_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, dict[str, Any]]:
        """A few fields of each job's request (read inside the JSON column, so a large graph is
        never loaded): model preset or HF model type, GPUs, objective, target, search."""
        req = Job.request
        cols = (Job.id, req["model"]["preset"].as_string(), req["model"]["hf_config"]["model_type"].as_string(),
                req["cluster"]["gpus"].as_string(), req["cluster"]["gpu"].as_string(),
                req["objective"]["kind"].as_string(), req["target"].as_string(), req["search"].as_string(),
                Job.solve_seconds)
        out: dict[uuid.UUID, dict[str, Any]] = {}
        for jid, preset, hf_type, gpus, gpu, objective, target, search, solve in self.session.execute(
                select(*cols).where(Job.id.in_(list(job_ids)))):
            model = preset or (f"hf:{hf_type}" if hf_type else "graph")
            out[jid] = {"model": model, "gpus": int(gpus) if gpus and str(gpus).isdigit() else None,
                        "gpu": gpu or "A100-80GB", "objective": objective or "min-memory", "target": target or "any",
                        "search": search or "auto", "solve_seconds": solve}
        return out

    def count_by_status(self) -> dict[str, int]:
        rows = self.session.execute(select(Job.status, func.count()).group_by(Job.status)).all()
        return {status: int(n) for status, n in rows}

    def solve_time_histogram(self, bounds: Sequence[float]) -> tuple[list[int], float, int]:
        """Cumulative counts of finished solves at or under each bound, their sum and count."""
        cols: list[Any] = [func.sum(case((Job.solve_seconds <= b, 1), else_=0)) for b in bounds]
        cols += [func.coalesce(func.sum(Job.solve_seconds), 0.0), func.count(Job.solve_seconds)]
        row = self.session.execute(select(*cols).where(Job.solve_seconds.is_not(None))).one()
        values = list(row)
        return [int(v or 0) for v in values[:-2]], float(values[-2] or 0.0), int(values[-1] or 0)

    # -- the history ------------------------------------------------------------------------------
    def _record(self, job_id: uuid.UUID, changed: bool = True) -> Job | None:
        """After an UPDATE of the job (``changed``: it matched the row), add its event: the job
        as it is now. Returns the job, or None when nothing changed."""
        if not changed:
            return None
        job = self.session.scalars(select(Job).where(Job.id == job_id)
                                   .execution_options(populate_existing=True)).one()
        self.session.add(JobEvent(job_id=job.id, status=job.status, document=job_out(job)))
        self.session.flush()
        return job

    # -- writes from the API ----------------------------------------------------------------------
    def add(self, job: Job) -> Job:
        self.session.add(job)
        self.session.flush()
        self.session.add(JobEvent(job_id=job.id, status=job.status, document=job_out(job)))
        self.session.flush()
        return job

    def request_cancel(self, job_id: uuid.UUID, now: datetime) -> None:
        """Queued: cancelled at once. Running: flagged; its worker stops the solve. Else nothing."""
        queued = self.session.execute(update(Job).where(Job.id == job_id, Job.status == Q)
                                      .values(status=JobStatus.CANCELLED.value, finished_at=now, updated_at=now,
                                              cancel_requested=True))
        self._record(job_id, _matched(queued))
        running = self.session.execute(update(Job).where(Job.id == job_id, Job.status == R,
                                                         Job.cancel_requested.is_(False))
                                       .values(cancel_requested=True, updated_at=now))
        self._record(job_id, _matched(running))

    # -- writes from workers ----------------------------------------------------------------------
    def claim(self, job_id: uuid.UUID, owner: str, worker: str, now: datetime, lease_seconds: float,
              max_attempts: int) -> Job | None:
        """Take the job if it is queued, or running with an expired lease (its worker died).
        Returns the job, or None when someone else has it or it is finished."""
        expired = (Job.status == R) & (Job.deadline_at < now) & Job.cancel_requested.is_(False)
        res = self.session.execute(
            update(Job).where(Job.id == job_id, (Job.status == Q) | expired, Job.attempts < max_attempts)
            .values(status=R, lease_owner=owner, worker=worker, attempts=Job.attempts + 1,
                    started_at=func.coalesce(Job.started_at, now), deadline_at=now + timedelta(seconds=lease_seconds),
                    updated_at=now, error=None, progress_stage="starting", progress_fraction=0.0)
            .execution_options(synchronize_session=False))
        if not _matched(res):
            return None
        self._record(job_id)
        return self.session.scalars(select(Job).where(Job.id == job_id)
                                    .options(undefer(Job.request), undefer(Job.calibration))
                                    .execution_options(populate_existing=True)).one()

    def renew(self, job_id: uuid.UUID, owner: str, now: datetime, lease_seconds: float,
              progress: tuple[str, float] | None = None) -> Lease:
        values: dict[str, Any] = {"deadline_at": now + timedelta(seconds=lease_seconds), "updated_at": now}
        if progress is not None:
            values["progress_stage"], values["progress_fraction"] = progress[0][:200], progress[1]
        res = self.session.execute(update(Job).where(Job.id == job_id, Job.lease_owner == owner, Job.status == R)
                                   .values(**values).execution_options(synchronize_session=False))
        if not _matched(res):
            return Lease(owned=False, cancel_requested=False)
        job = self._record(job_id, progress is not None)
        flag = job.cancel_requested if job is not None else self.session.scalar(
            select(Job.cancel_requested).where(Job.id == job_id))
        return Lease(owned=True, cancel_requested=bool(flag))

    def finish(self, job_id: uuid.UUID, owner: str, status: JobStatus, now: datetime, *,
               plan_id: uuid.UUID | None = None, error: dict[str, Any] | None = None,
               solve_seconds: float | None = None) -> bool:
        """Close a running job the caller owns. False if the lease was lost (nothing written)."""
        values: dict[str, Any] = {"status": status.value, "finished_at": now, "updated_at": now, "deadline_at": None,
                                  "plan_id": plan_id, "error": error, "solve_seconds": solve_seconds}
        if status is JobStatus.SUCCEEDED:
            values.update(progress_stage="done", progress_fraction=1.0)
        res = self.session.execute(update(Job).where(Job.id == job_id, Job.lease_owner == owner, Job.status == R)
                                   .values(**values).execution_options(synchronize_session=False))
        return self._record(job_id, _matched(res)) is not None

    def release(self, job_id: uuid.UUID, owner: str, now: datetime) -> bool:
        """Give a running job back to the queue (worker shutting down); the attempt does not count."""
        res = self.session.execute(
            update(Job).where(Job.id == job_id, Job.lease_owner == owner, Job.status == R)
            .values(status=Q, lease_owner=None, worker=None, deadline_at=None, updated_at=now, enqueued_at=now,
                    progress_stage="queued", progress_fraction=0.0,
                    attempts=case((Job.attempts > 0, Job.attempts - 1), else_=0))
            .execution_options(synchronize_session=False))
        return self._record(job_id, _matched(res)) is not None

    # -- sweep jobs (capacity, replan): no lease; they end when their cells have ---------------------
    def sweep_progress(self, job_id: uuid.UUID, stage: str, fraction: float, now: datetime) -> bool:
        """Record a running sweep job's progress (an event when it changed)."""
        res = self.session.execute(update(Job).where(Job.id == job_id, Job.status == R, Job.lease_owner.is_(None),
                                                     (Job.progress_stage != stage[:200]) | Job.progress_stage.is_(None))
                                   .values(progress_stage=stage[:200], progress_fraction=fraction, updated_at=now)
                                   .execution_options(synchronize_session=False))
        return self._record(job_id, _matched(res)) is not None

    def close_sweep(self, job_id: uuid.UUID, status: JobStatus, now: datetime,
                    error: dict[str, Any] | None = None) -> bool:
        """End a running sweep job (False: it had already ended)."""
        values: dict[str, Any] = {"status": status.value, "finished_at": now, "updated_at": now, "error": error}
        if status is JobStatus.SUCCEEDED:
            values.update(progress_stage="done", progress_fraction=1.0)
        res = self.session.execute(update(Job).where(Job.id == job_id, Job.status == R, Job.lease_owner.is_(None))
                                   .values(**values).execution_options(synchronize_session=False))
        return self._record(job_id, _matched(res)) is not None

    # -- writes from the sweeper ------------------------------------------------------------------
    def expired_running(self, now: datetime, limit: int = 500) -> list[Job]:
        stmt = select(Job).where(Job.status == R, Job.deadline_at < now).order_by(Job.deadline_at).limit(limit)
        return list(self.session.scalars(stmt))

    def requeue_expired(self, job_id: uuid.UUID, now: datetime) -> bool:
        res = self.session.execute(
            update(Job).where(Job.id == job_id, Job.status == R, Job.deadline_at < now)
            .values(status=Q, lease_owner=None, worker=None, deadline_at=None, enqueued_at=now, updated_at=now,
                    progress_stage="requeued")
            .execution_options(synchronize_session=False))
        return self._record(job_id, _matched(res)) is not None

    def close_expired(self, job_id: uuid.UUID, now: datetime, status: JobStatus,
                      error: dict[str, Any] | None) -> bool:
        res = self.session.execute(
            update(Job).where(Job.id == job_id, Job.status == R, Job.deadline_at < now)
            .values(status=status.value, lease_owner=None, deadline_at=None, finished_at=now, updated_at=now,
                    error=error)
            .execution_options(synchronize_session=False))
        return self._record(job_id, _matched(res)) is not None

    def stale_queued(self, enqueued_before: datetime, limit: int = 500) -> list[Job]:
        stmt = (select(Job).where(Job.status == Q, (Job.enqueued_at < enqueued_before) | Job.enqueued_at.is_(None))
                .order_by(Job.created_at).limit(limit))
        return list(self.session.scalars(stmt))

    def lock_submissions(self) -> None:
        """PostgreSQL: hold a transaction-scoped advisory lock, so concurrent submissions (from any
        API process) count the jobs and insert theirs one after another (SQLite serialises writers)."""
        if self.session.get_bind().dialect.name == "postgresql":
            self.session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": SUBMISSIONS_LOCK})

    def admission_counts(self, token_id: uuid.UUID | None) -> tuple[int, int]:
        """``(queued or running jobs of the token, queued jobs in all)`` in one query (0 for no token)."""
        mine = (func.count().filter(Job.token_id == token_id) if token_id is not None
                else literal(0, type_=Integer))
        row = self.session.execute(select(mine, func.count().filter(Job.status == Q))
                                   .select_from(Job).where(Job.status.in_((Q, R)))).one()
        return int(row[0] or 0), int(row[1] or 0)

    def count_queued(self) -> int:
        return int(self.session.scalar(select(func.count()).select_from(Job).where(Job.status == Q)) or 0)

    # -- the fair dispatcher (Celery layout): queued jobs with no ``enqueued_at`` wait in the database --
    def waiting_heads(self, per_token: int) -> list[tuple[uuid.UUID, uuid.UUID | None, datetime]]:
        """The oldest ``per_token`` waiting jobs of each token: ``(id, token_id, created_at)``."""
        rank = func.row_number().over(partition_by=Job.token_id, order_by=(Job.created_at, Job.id)).label("rank")
        inner = (select(Job.id, Job.token_id, Job.created_at, rank)
                 .where(Job.status == Q, Job.enqueued_at.is_(None)).subquery())
        rows = self.session.execute(select(inner.c.id, inner.c.token_id, inner.c.created_at)
                                    .where(inner.c.rank <= per_token).order_by(inner.c.created_at))
        return [(r[0], r[1], r[2]) for r in rows]

    def in_flight_by_token(self) -> dict[uuid.UUID | None, int]:
        """Jobs each token has running or handed to the broker."""
        sent = (Job.status == Q) & Job.enqueued_at.is_not(None)
        rows = self.session.execute(select(Job.token_id, func.count()).where((Job.status == R) | sent)
                                    .group_by(Job.token_id))
        return {token: int(n) for token, n in rows}

    def mark_sent(self, job_id: uuid.UUID, now: datetime) -> bool:
        """Take a waiting job for the broker (False: another dispatcher took it, or it is no longer queued)."""
        res = self.session.execute(update(Job).where(Job.id == job_id, Job.status == Q, Job.enqueued_at.is_(None))
                                   .values(enqueued_at=now).execution_options(synchronize_session=False))
        return _matched(res)

    def mark_sent_all(self, job_ids: Sequence[uuid.UUID], now: datetime) -> set[uuid.UUID]:
        """:meth:`mark_sent` for several jobs in one statement; the ids taken."""
        if not job_ids:
            return set()
        rows = self.session.execute(update(Job).where(Job.id.in_(list(job_ids)), Job.status == Q,
                                                      Job.enqueued_at.is_(None))
                                    .values(enqueued_at=now).returning(Job.id)
                                    .execution_options(synchronize_session=False))
        return {r[0] for r in rows}

    def unsend(self, job_ids: Sequence[uuid.UUID], sent_before: datetime | None = None) -> list[uuid.UUID]:
        """Put queued jobs back among the waiting (their message was not sent, or is lost); those changed."""
        cond = [Job.id.in_(list(job_ids)), Job.status == Q, Job.enqueued_at.is_not(None)]
        if sent_before is not None:
            cond.append(Job.enqueued_at < sent_before)
        rows = self.session.execute(update(Job).where(*cond).values(enqueued_at=None).returning(Job.id)
                                    .execution_options(synchronize_session=False))
        return [r[0] for r in rows]

    def stale_sent(self, sent_before: datetime, limit: int = 500) -> list[uuid.UUID]:
        """Queued jobs handed to the broker before ``sent_before`` and not yet claimed, oldest first."""
        return list(self.session.scalars(select(Job.id).where(Job.status == Q, Job.enqueued_at < sent_before)
                                         .order_by(Job.enqueued_at).limit(limit)))

    def count_sent(self) -> int:
        """Queued jobs handed to the broker (their messages should be in it)."""
        return int(self.session.scalar(select(func.count()).select_from(Job)
                                       .where(Job.status == Q, Job.enqueued_at.is_not(None))) or 0)

    def mark_enqueued(self, job_id: uuid.UUID, now: datetime, enqueued_before: datetime | None = None) -> bool:
        cond = [Job.id == job_id, Job.status == Q]
        if enqueued_before is not None:
            cond.append((Job.enqueued_at < enqueued_before) | Job.enqueued_at.is_(None))
        res = self.session.execute(update(Job).where(*cond).values(enqueued_at=now)
                                   .execution_options(synchronize_session=False))
        return getattr(res, "rowcount", 0) == 1


def _matched(result: Any) -> bool:
    """Whether a conditional UPDATE matched the job's row."""
    return getattr(result, "rowcount", 0) == 1

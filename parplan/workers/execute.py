"""Running one job: the only place that turns a queued job into a plan.

Both executors call :func:`execute_job` with nothing but the job id; it re-reads the job, so a
duplicate or late message is harmless:

1. *Claim* — one conditional UPDATE takes the job if it is queued (or running with an expired
   lease, i.e. its worker died) and gives this call a fresh lease owner id.
2. *Solve* in a child process (:class:`~parplan.workers.solve_process.SolveProcess`); every
   heartbeat renews the lease, writes the latest progress and reads the cancel flag. A cancel
   terminates the child.
3. *Finish* — store the plan (get-or-create by cache key) and close the job in one transaction,
   conditional on still owning the lease: a worker that lost its job to the sweeper writes nothing.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from enum import StrEnum
from typing import Any, TypeVar

from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session

from parplan.service.database import utcnow
from parplan.service.jobs.repository import JobRepository, Lease
from parplan.service.models import Job, JobStatus
from parplan.service.plans.repository import PlanRepository
from parplan.service.settings import Settings
from parplan.solver import SOLVER_VERSION
from parplan.workers.solve_process import SolveProcess

log = logging.getLogger("parplan.workers")

T = TypeVar("T")
SessionFactory = Callable[[], Session]


class Outcome(StrEnum):
    SKIPPED = "skipped"        # not ours to run (finished, cancelled, or another worker holds it)
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    LOST = "lost"              # our lease expired and someone else took the job over
    RELEASED = "released"      # we are shutting down; the job went back to the queue


class TransientError(Exception):
    """The database could not be reached; running the task again later may succeed."""


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, OperationalError | PoolTimeout):
        return True
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _transaction(sf: SessionFactory, fn: Callable[[Session], T]) -> T:
    with sf() as session:
        try:
            out = fn(session)
            session.commit()
            return out
        except BaseException:
            session.rollback()
            raise


def _retrying(sf: SessionFactory, fn: Callable[[Session], T], attempts: int = 6, first_delay: float = 0.5) -> T:
    """Run ``fn`` in a transaction, retrying transient database errors with exponential backoff."""
    delay = first_delay
    for i in range(attempts):
        try:
            return _transaction(sf, fn)
        except Exception as e:
            if not is_transient(e) or i == attempts - 1:
                raise
            log.warning("database unavailable (%s); retrying in %.1fs", e.__class__.__name__, delay)
            time.sleep(delay)
            delay = min(delay * 2, 10.0)
    raise AssertionError("unreachable")


def finite(value: Any) -> Any:
    """``value`` with NaN and infinities replaced by None (JSON columns reject them)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def _store_plan(session: Session, job: Job, doc: dict[str, Any]) -> uuid.UUID:
    time_doc = doc.get("time") if isinstance(doc.get("time"), dict) else None
    source = (time_doc or {}).get("calibration") or (job.calibration or {}).get("source") or "default"
    plan = PlanRepository(session).get_or_create(
        job.cache_key, request_hash=job.request_hash, solver_version=SOLVER_VERSION,
        calibration_source=str(source)[:200], request=job.request, document=finite(doc))
    session.flush()
    return plan.id


def execute_job(job_id: uuid.UUID, sf: SessionFactory, settings: Settings, *,
                stop: threading.Event | None = None, worker: str | None = None) -> Outcome:
    """Run job ``job_id`` to an end state, if it is ours to run. Raises TransientError when the
    database cannot be reached to claim it (the caller retries later)."""
    owner = uuid.uuid4().hex
    me = worker or worker_name()
    job = _claim(sf, settings, job_id, owner, me)
    if job is None:
        log.info("job %s: not claimable (finished, cancelled or held by a live worker); skipping", job_id)
        return Outcome.SKIPPED
    log.info("job %s: claimed by %s (attempt %d)", job_id, me, job.attempts)

    # Another job may have solved the same request meanwhile: reuse its plan.
    def reuse(s: Session) -> bool:
        plan = PlanRepository(s).by_cache_key(job.cache_key)
        return plan is not None and JobRepository(s).finish(job_id, owner, JobStatus.SUCCEEDED, utcnow(),
                                                             plan_id=plan.id, solve_seconds=None)
    if _retrying(sf, reuse):
        log.info("job %s: served from a plan solved meanwhile", job_id)
        return Outcome.SUCCEEDED
    return _Solve(job_id, job, owner, sf, settings, stop).run()


def _claim(sf: SessionFactory, settings: Settings, job_id: uuid.UUID, owner: str, me: str) -> Job | None:
    """The claimed job row, or None when it is not ours to run (TransientError: no database)."""
    try:
        return _transaction(sf, lambda s: JobRepository(s).claim(job_id, owner, me, utcnow(),
                                                                 settings.job_lease_seconds,
                                                                 settings.job_max_attempts))
    except Exception as e:
        if is_transient(e):
            raise TransientError(str(e)) from e
        raise


class _Solve:
    """One claimed job's solve in its own process: progress and lease renewal at every heartbeat,
    the plan stored when it comes, and an end state for every way the solve can stop."""

    def __init__(self, job_id: uuid.UUID, job: Job, owner: str, sf: SessionFactory, settings: Settings,
                 stop: threading.Event | None) -> None:
        self.job, self.job_id, self.owner, self.sf, self.settings, self.stop = job, job_id, owner, sf, settings, stop
        self.started = time.monotonic()
        self.proc = SolveProcess(job.request, job.calibration, nice=settings.solver_nice)
        self.heartbeat = min(1.0, settings.job_lease_seconds / 4)
        self.last_beat = time.monotonic()
        self.pending: tuple[str, float] | None = None  # the latest progress not yet written
        self.written_stage = "starting"

    def run(self) -> Outcome:
        try:
            while True:
                wait = max(0.05, self.heartbeat - (time.monotonic() - self.last_beat))
                for msg in self.proc.read(timeout=wait):
                    outcome = self._message(msg)
                    if outcome is not None:
                        return outcome
                outcome = self._check()
                if outcome is not None:
                    return outcome
        finally:
            self.proc.kill()

    def _message(self, msg: dict[str, Any]) -> Outcome | None:
        if "progress" in msg:
            p = msg["progress"]
            self.pending = (str(p.get("stage", "")), min(1.0, max(0.0, float(p.get("fraction", 0.0)))))
            return None
        if "plan" in msg:
            return self._store(msg["plan"], time.monotonic() - self.started)
        if "error" in msg:
            return _fail(self.sf, self.job_id, self.owner, dict(msg["error"]))
        return None

    def _store(self, doc: dict[str, Any], seconds: float) -> Outcome:
        job_id, owner, job = self.job_id, self.owner, self.job

        def succeed(s: Session) -> bool:
            plan_id = _store_plan(s, job, doc)
            if not JobRepository(s).finish(job_id, owner, JobStatus.SUCCEEDED, utcnow(),
                                           plan_id=plan_id, solve_seconds=seconds):
                s.rollback()
                return False
            return True
        if _retrying(self.sf, succeed):
            log.info("job %s: succeeded in %.2fs", job_id, seconds)
            return Outcome.SUCCEEDED
        log.warning("job %s: lease lost before the plan was stored; another worker has it", job_id)
        return Outcome.LOST

    def _check(self) -> Outcome | None:
        """Between reads: the process's end, a stopping worker, the time limit, the heartbeat."""
        job_id, owner, sf = self.job_id, self.owner, self.sf
        if self.proc.finished:
            return _fail(sf, job_id, owner, {"code": "internal", "type": "SolverCrashed",
                                             "message": f"the solver process {self.proc.exit_description()}"})
        now = time.monotonic()
        if self.stop is not None and self.stop.is_set():
            self.proc.kill()
            _retrying(sf, lambda s: JobRepository(s).release(job_id, owner, utcnow()), attempts=2)
            log.info("job %s: released (worker stopping)", job_id)
            return Outcome.RELEASED
        limit = self.settings.job_timeout_seconds
        if now - self.started > limit:
            self.proc.kill()
            return _fail(sf, job_id, owner, {"code": "timeout", "type": "Timeout",
                                             "message": f"the solve ran past {limit:g}s"})
        # Write at every heartbeat, and at once when the solver enters a new stage.
        if now - self.last_beat >= self.heartbeat or (self.pending is not None
                                                      and self.pending[0] != self.written_stage):
            return self._renew(now)
        return None

    def _renew(self, now: float) -> Outcome | None:
        job_id, owner, sf = self.job_id, self.owner, self.sf
        progress, self.pending = self.pending, None
        if progress is not None:
            self.written_stage = progress[0]
        lease = self.settings.job_lease_seconds

        def renew(s: Session) -> Lease:
            return JobRepository(s).renew(job_id, owner, utcnow(), lease, progress)
        try:
            state = _transaction(sf, renew)
        except Exception as e:
            if not is_transient(e):
                raise
            log.warning("job %s: lease renewal failed (%s); solving on", job_id, e.__class__.__name__)
            self.last_beat = now
            return None
        self.last_beat = now
        if not state.owned:
            self.proc.kill()
            log.warning("job %s: lease lost (the sweeper re-queued it); stopping this solve", job_id)
            return Outcome.LOST
        if state.cancel_requested:
            self.proc.kill()
            _retrying(sf, lambda s: JobRepository(s).finish(
                job_id, owner, JobStatus.CANCELLED, utcnow(),
                error={"code": "cancelled", "type": "Cancelled", "message": "cancelled by request"}))
            log.info("job %s: cancelled", job_id)
            return Outcome.CANCELLED
        return None


def _fail(sf: SessionFactory, job_id: uuid.UUID, owner: str, error: dict[str, Any]) -> Outcome:
    err = {"code": str(error.get("code", "internal")), "type": str(error.get("type", "Error")),
           "message": str(error.get("message", ""))[:4000]}
    done = _retrying(sf, lambda s: JobRepository(s).finish(job_id, owner, JobStatus.FAILED, utcnow(), error=err))
    log.info("job %s: failed (%s: %s)%s", job_id, err["type"], err["message"], "" if done else " [lease lost]")
    return Outcome.FAILED if done else Outcome.LOST

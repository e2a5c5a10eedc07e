"""The sweeper: puts work that lost its worker or its message back in the queue.

- *Running jobs past their lease* (the worker died or hung): back to ``queued`` and enqueued
  again, unless the job was asked to cancel (then ``cancelled``) or already used all its attempts
  (then ``failed``).
- *Queued jobs not picked up for* ``job_requeue_seconds``: their broker message may be gone (Redis
  restarted without persistence). With Celery, as many of the oldest as the queue is short of
  (jobs handed to it in the database minus messages in Redis) go back among the jobs waiting for
  the fair dispatcher (:meth:`~parplan.service.dispatch.Dispatcher.recover_lost`; with
  ``dispatch_window`` 0, no dispatcher: they are re-sent); the in-process executor ignores ids it
  already holds, so there all of them are re-sent. Duplicates are harmless: tasks claim jobs with
  a conditional UPDATE.
- *Claimed validations whose agent stopped heart-beating*: back to ``queued``.

Every change is a conditional UPDATE, so sweepers in several processes do not conflict. Enqueueing
happens after the commit.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from parplan.service.capacity.settle import settle_running
from parplan.service.database import utcnow
from parplan.service.dispatch import Dispatcher
from parplan.service.jobs.repository import JobRepository
from parplan.service.models import JobStatus
from parplan.service.queue import JobQueue
from parplan.service.settings import Settings
from parplan.service.validations.repository import ValidationRepository

log = logging.getLogger("parplan.service")


@dataclass
class SweepReport:
    requeued_running: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    resent_queued: list[str] = field(default_factory=list)
    requeued_validations: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.requeued_running or self.failed or self.cancelled or self.resent_queued
                    or self.requeued_validations)


def sweep(session_factory: Callable[[], Session], queue: JobQueue, settings: Settings,
          now: datetime | None = None, *, requeue_after: float | None = None) -> SweepReport:
    """One pass. ``requeue_after`` overrides ``job_requeue_seconds`` (0 at start-up of the
    in-process executor, whose queue starts empty)."""
    now = now or utcnow()
    report = SweepReport()
    to_send = []
    with session_factory() as s:
        jobs = JobRepository(s)
        for job in jobs.expired_running(now):
            if job.cancel_requested:
                if jobs.close_expired(job.id, now, JobStatus.CANCELLED,
                                      {"code": "cancelled", "type": "Cancelled", "message": "cancelled by request"}):
                    report.cancelled.append(str(job.id))
            elif job.attempts >= settings.job_max_attempts:
                msg = (f"the worker running this job was lost {job.attempts} times "
                       f"(last: {job.worker or 'unknown'}); giving up")
                if jobs.close_expired(job.id, now, JobStatus.FAILED,
                                      {"code": "worker-lost", "type": "WorkerLost", "message": msg}):
                    report.failed.append(str(job.id))
            elif jobs.requeue_expired(job.id, now):
                report.requeued_running.append(str(job.id))
                to_send.append(job.id)
        threshold = now - timedelta(seconds=settings.job_requeue_seconds if requeue_after is None else requeue_after)
        if isinstance(queue, Dispatcher):  # waiting jobs are the dispatcher's; only lost messages are ours
            for job_id in queue.recover_lost(jobs, threshold):
                report.resent_queued.append(str(job_id))
                to_send.append(job_id)
        elif stale := jobs.stale_queued(threshold):
            if queue.deduplicates:
                missing = len(stale)
            else:
                depth = queue.depth()
                missing = len(stale) if depth is None else max(0, jobs.count_queued() - depth)
            for job in stale[:missing]:
                if jobs.mark_enqueued(job.id, now, threshold):
                    report.resent_queued.append(str(job.id))
                    to_send.append(job.id)
        vals = ValidationRepository(s)
        for v in vals.abandoned(now - timedelta(seconds=settings.agent_timeout_seconds)):
            if vals.requeue(v.id, v.agent_id):
                report.requeued_validations.append(str(v.id))
        settle_running(s)  # capacity sweeps and replans whose last cell ended without telling them
        s.commit()
    for job_id in to_send:
        queue.enqueue(job_id)
    if not report.empty:
        log.info("sweeper: %s", report)
    return report


class SweeperThread(threading.Thread):
    """Runs :func:`sweep` every ``sweep_interval_seconds`` until stopped."""

    def __init__(self, session_factory: Callable[[], Session], queue: JobQueue, settings: Settings) -> None:
        super().__init__(name="parplan-sweeper", daemon=True)
        self.session_factory, self.queue, self.settings = session_factory, queue, settings
        self._stop_event = threading.Event()

    def run(self) -> None:
        first = True
        while not self._stop_event.is_set():
            try:
                sweep(self.session_factory, self.queue, self.settings,
                      requeue_after=0 if first and self.queue.deduplicates else None)
                first = False
            except Exception as e:
                log.warning("sweeper pass failed: %s: %s", e.__class__.__name__, e)
            self._stop_event.wait(self.settings.sweep_interval_seconds)

    def stop(self) -> None:
        self._stop_event.set()

"""The embedded default's executor: a bounded pool of solver processes inside ``parplan serve``.

Each job runs :func:`~parplan.workers.execute.execute_job` on one of ``executor_workers``
threads; the solve itself happens in a child process (one per job), so the event loop never
waits on a solver, and a cancel terminates just that child. Waiting jobs are started in turn by
the token that submitted them (:class:`~parplan.workers.fair.FairQueue`), so one client's burst
does not hold back everyone else's jobs.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Hashable

from sqlalchemy import select
from sqlalchemy.orm import Session

from parplan.service.models import Job
from parplan.service.settings import Settings
from parplan.workers.execute import TransientError, execute_job
from parplan.workers.fair import FairQueue
from parplan.workers.sweeps import settle_after

log = logging.getLogger("parplan.workers")


class InProcessJobQueue:
    kind = "in-process"
    fair = True
    deduplicates = True

    def __init__(self, settings: Settings, session_factory: Callable[[], Session]) -> None:
        self.settings = settings
        self.session_factory = session_factory
        self._threads: list[threading.Thread] = []
        self._waiting: FairQueue[uuid.UUID] = FairQueue()
        self._pending: set[uuid.UUID] = set()
        self._running = 0
        #: Jobs a thread is running now, and those of them enqueued again meanwhile (the sweeper
        #: requeued the job while its old attempt was still winding down): run those once more.
        self._running_ids: set[uuid.UUID] = set()
        self._again: set[uuid.UUID] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def start(self) -> None:
        if not self._threads:
            self._stop.clear()
            self._waiting = FairQueue()
            self._threads = [threading.Thread(target=self._serve, name=f"solve-{i}", daemon=True)
                             for i in range(self.settings.executor_workers)]
            for t in self._threads:
                t.start()

    def _owner(self, job_id: uuid.UUID) -> Hashable:
        """The token that submitted the job (its lane in the fair queue)."""
        try:
            with self.session_factory() as s:
                return s.scalar(select(Job.token_id).where(Job.id == job_id))
        except Exception as e:  # the job still runs; only its turn is not by token
            log.warning("job %s: cannot read its token (%s)", job_id, e.__class__.__name__)
            return None

    def enqueue(self, job_id: uuid.UUID) -> bool:
        with self._lock:
            if not self._threads or self._stop.is_set():
                return False
            if job_id in self._running_ids:
                self._again.add(job_id)
                return True
            if job_id in self._pending:
                return True
            self._pending.add(job_id)
        self._waiting.put(self._owner(job_id), job_id)
        return True

    def _serve(self) -> None:
        while not self._stop.is_set():
            job_id = self._waiting.get(timeout=1.0)
            if job_id is not None:
                self._run(job_id)

    def _run(self, job_id: uuid.UUID) -> None:
        with self._lock:
            self._running += 1
            self._running_ids.add(job_id)
        try:
            delay = 0.5
            for _ in range(6):
                if self._stop.is_set():
                    return
                try:
                    execute_job(job_id, self.session_factory, self.settings, stop=self._stop)
                    settle_after(job_id, self.session_factory)
                    return
                except TransientError as e:
                    log.warning("job %s: database unavailable (%s); retrying in %.1fs", job_id, e, delay)
                    time.sleep(delay)
                    delay *= 2
            log.error("job %s: giving up for now; the sweeper will enqueue it again", job_id)
        except Exception:
            log.exception("job %s: executor error", job_id)
        finally:
            with self._lock:
                self._pending.discard(job_id)
                self._running -= 1
                self._running_ids.discard(job_id)
                again = job_id in self._again
                self._again.discard(job_id)
            if again:
                self.enqueue(job_id)

    def depth(self) -> int | None:
        with self._lock:
            return len(self._pending) - self._running

    def ping(self) -> bool:
        return bool(self._threads) and not self._stop.is_set()

    def close(self) -> None:
        """Stop: waiting jobs stay queued in the database; running ones are released."""
        self._stop.set()
        self._waiting.close()
        threads, self._threads = self._threads, []
        for t in threads:
            t.join()
        with self._lock:
            self._pending.clear()
            self._again.clear()

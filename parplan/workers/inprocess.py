"""The embedded default's executor: a bounded pool of solver processes inside ``parplan serve``.

Each job runs :func:`~parplan.workers.execute.execute_job` on one of ``executor_workers``
threads; the solve itself happens in a child process (one per job), so the event loop never
waits on a solver, and a cancel terminates just that child.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy.orm import Session

from parplan.service.settings import Settings
from parplan.workers.execute import TransientError, execute_job

log = logging.getLogger("parplan.workers")


class InProcessJobQueue:
    kind = "in-process"
    deduplicates = True

    def __init__(self, settings: Settings, session_factory: Callable[[], Session]) -> None:
        self.settings = settings
        self.session_factory = session_factory
        self._pool: ThreadPoolExecutor | None = None
        self._pending: set[uuid.UUID] = set()
        self._running = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def start(self) -> None:
        if self._pool is None:
            self._stop.clear()
            self._pool = ThreadPoolExecutor(max_workers=self.settings.executor_workers, thread_name_prefix="solve")

    def enqueue(self, job_id: uuid.UUID) -> bool:
        with self._lock:
            if self._pool is None or self._stop.is_set():
                return False
            if job_id in self._pending:
                return True
            self._pending.add(job_id)
            self._pool.submit(self._run, job_id)
        return True

    def _run(self, job_id: uuid.UUID) -> None:
        with self._lock:
            self._running += 1
        try:
            delay = 0.5
            for _ in range(6):
                if self._stop.is_set():
                    return
                try:
                    execute_job(job_id, self.session_factory, self.settings, stop=self._stop)
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

    def depth(self) -> int | None:
        with self._lock:
            return len(self._pending) - self._running

    def ping(self) -> bool:
        return self._pool is not None and not self._stop.is_set()

    def close(self) -> None:
        self._stop.set()
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

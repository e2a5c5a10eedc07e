"""Limits that keep one client, or all of them together, from overloading the service:

- a token bucket per token (or per client address without one): ``PARPLAN_RATE_LIMIT_PER_SECOND``
  requests a second after a burst of ``PARPLAN_RATE_LIMIT_BURST``; over it, 429 with ``Retry-After``;
- queued or running jobs per token: ``PARPLAN_MAX_ACTIVE_JOBS_PER_TOKEN``; a new job beyond it, 429;
- queued jobs in all: ``PARPLAN_MAX_QUEUED_JOBS``; a new job beyond it, 503 with ``Retry-After``.

A cached plan or a request that joins a job in flight creates no job, so the job limits never refuse it.
With Redis configured (``PARPLAN_BROKER_URL``) the buckets live there and every API process shares
them (:class:`SharedRateLimiter`); without it, or while Redis is unreachable, each process keeps its
own. The job limits count rows in the database, which every process shares; on PostgreSQL a new
job's admission holds a transaction-scoped advisory lock, so concurrent submissions through any
number of processes never overshoot them.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Callable, Hashable

from sqlalchemy.orm import Session

from parplan.service.jobs.repository import JobRepository
from parplan.service.problems import ProblemError
from parplan.service.settings import Settings


class TooManyRequestsError(ProblemError):
    status = 429
    type_ = "too-many-requests"

    def __init__(self, detail: str, retry_after: float) -> None:
        super().__init__(detail, headers={"Retry-After": str(max(1, math.ceil(retry_after)))})


class OverloadedError(ProblemError):
    status = 503
    type_ = "overloaded"

    def __init__(self, detail: str, retry_after: float) -> None:
        super().__init__(detail, headers={"Retry-After": str(max(1, math.ceil(retry_after)))})


class RateLimiter:
    """Token buckets by key: ``burst`` requests at once, refilled at ``rate`` a second."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic,
                 max_keys: int = 100_000) -> None:
        self.rate, self.burst, self.clock, self.max_keys = rate, burst, clock, max_keys
        self._buckets: dict[Hashable, tuple[float, float]] = {}  # key -> (tokens, at)
        self._lock = threading.Lock()

    def wait_seconds(self, key: Hashable) -> float:
        """Take one request for ``key``: 0 when allowed, else how long until one would be."""
        now = self.clock()
        with self._lock:
            tokens, at = self._buckets.get(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) * self.rate)
            if tokens >= 1.0:
                if len(self._buckets) >= self.max_keys and key not in self._buckets:
                    self._buckets.clear()  # a flood of addresses: forget them all rather than grow
                self._buckets[key] = (tokens - 1.0, now)
                return 0.0
            self._buckets[key] = (tokens, now)
            return (1.0 - tokens) / self.rate

    def close(self) -> None:
        """Release what the limiter holds (nothing here)."""

    def check(self, key: Hashable, who: str) -> None:
        wait = self.wait_seconds(key)
        if wait > 0:
            raise TooManyRequestsError(f"rate limit of {who}: {self.rate:g} requests a second after a burst of "
                                       f"{self.burst} (PARPLAN_RATE_LIMIT_PER_SECOND); retry in {wait:.1f} s", wait)


def admit_new_job(session: Session, token_id: uuid.UUID | None, settings: Settings) -> None:
    """Raise 429 when the token has its share of jobs queued or running, 503 when the queue is full."""
    jobs = JobRepository(session)
    jobs.lock_submissions()  # until commit: both counts stay exact under concurrent submissions
    active, queued = jobs.admission_counts(token_id)
    if token_id is not None and active >= settings.max_active_jobs_per_token:
        raise TooManyRequestsError(
            f"this token has {active} jobs queued or running, its limit (PARPLAN_MAX_ACTIVE_JOBS_PER_TOKEN); "
            "wait for one to finish or cancel one", settings.retry_after_seconds)
    if queued >= settings.max_queued_jobs:
        raise OverloadedError(f"the service has {queued} jobs queued, its limit (PARPLAN_MAX_QUEUED_JOBS); "
                              "retry later", settings.retry_after_seconds)

"""The job-queue interface the API enqueues through. The service owns it; the workers package
implements it (Celery over Redis, or the in-process executor) and hands the service a
:data:`QueueFactory` (``parplan.workers.factory.make_queue``, wired in :mod:`parplan.server`).
The service never imports the workers: everything above this interface is the same code in both
layouts."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from sqlalchemy.orm import Session

from parplan.service.settings import Settings


@runtime_checkable
class JobQueue(Protocol):
    """Hands job ids to whatever runs them. Messages carry only the id; losing one is
    harmless because the sweeper re-enqueues jobs the database still says are queued."""

    kind: str
    #: True when enqueueing an id that is already waiting is a no-op (the sweeper then re-sends
    #: every stale job instead of estimating how many messages were lost).
    deduplicates: bool
    #: True when the queue itself starts waiting jobs in turn by token (the in-process executor).
    #: False for a first-come-first-served broker: the runtime puts a fair
    #: :class:`~parplan.service.dispatch.Dispatcher` in front of it.
    fair: bool

    def start(self) -> None:
        """Begin accepting work (the in-process executor starts its threads)."""

    def enqueue(self, job_id: uuid.UUID) -> bool:
        """Hand ``job_id`` over; False when that failed (the broker is down). Never raises."""

    def depth(self) -> int | None:
        """Jobs waiting in the queue, or None when that cannot be known right now."""

    def ping(self) -> bool:
        """True when the queue (its broker) is reachable."""

    def close(self) -> None:
        """Stop; running in-process solves are released back to the queue."""


#: Builds the queue a runtime enqueues through, from the settings and a database session factory.
QueueFactory = Callable[[Settings, Callable[[], Session]], JobQueue]

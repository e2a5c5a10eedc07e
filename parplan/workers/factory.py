"""The workers' side of the service's queue interface: the factory that picks the implementation,
Celery over Redis when ``PARPLAN_BROKER_URL`` is set, else the in-process executor."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.orm import Session

from parplan.service.queue import JobQueue
from parplan.service.settings import Settings


def make_queue(settings: Settings, session_factory: Callable[[], Session]) -> JobQueue:
    """A :data:`parplan.service.queue.QueueFactory`."""
    if settings.broker_url:
        from parplan.workers.celery_app import CeleryJobQueue

        return CeleryJobQueue(settings)
    from parplan.workers.inprocess import InProcessJobQueue

    return InProcessJobQueue(settings, session_factory)

"""Celery tasks: thin wrappers that take an id and call the shared execution code. Each task first
tops up the broker's queue from the jobs waiting in the database (:func:`top_up`: the fair
dispatcher's pass), since taking its message made room there."""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any

from celery import Celery
from celery.signals import worker_process_init
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from parplan.service.database import make_engine, make_session_factory
from parplan.service.dispatch import Dispatcher
from parplan.service.settings import Settings
from parplan.workers.celery_app import RUN_JOB, CeleryJobQueue
from parplan.workers.execute import TransientError, execute_job
from parplan.workers.sweeps import settle_after

log = logging.getLogger("parplan.workers")


class _Context:
    """The database engine and the fair dispatcher of this worker process, made on first use
    (after the pool forks)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._engine: Engine | None = None
        self._factory: sessionmaker[Session] | None = None
        self._dispatcher: Dispatcher | None = None

    def session_factory(self, settings: Settings) -> sessionmaker[Session]:
        with self._lock:
            if self._factory is None:
                self._engine = make_engine(settings.resolved_database_url, pool_size=2, max_overflow=2)
                self._factory = make_session_factory(self._engine)
            return self._factory

    def dispatcher(self, settings: Settings) -> Dispatcher | None:
        """The dispatcher this process tops the broker's queue up with (its thread is never started);
        None when there is none (``dispatch_window`` 0: first come, first served)."""
        if settings.dispatch_window <= 0 or not settings.broker_url:
            return None
        with self._lock:
            if self._dispatcher is None:
                self._dispatcher = Dispatcher(CeleryJobQueue(settings), self.session_factory(settings), settings)
            return self._dispatcher

    def reset(self) -> None:
        with self._lock:
            if self._engine is not None:
                self._engine.dispose(close=False)
            self._engine, self._factory, self._dispatcher = None, None, None


def top_up(settings: Settings) -> list[uuid.UUID]:
    """One pass of the fair dispatcher from this worker (the ids it handed to the broker). A task
    that starts has just taken its message off the broker's list; refilling the window here, rather
    than waiting for an API process's next pass, keeps that work out of the API processes. Never
    raises: the API's passes and the sweeper cover a pass that failed."""
    try:
        dispatcher = CONTEXT.dispatcher(settings)
        return dispatcher.dispatch_once() if dispatcher is not None else []
    except Exception as e:
        log.warning("dispatch pass failed: %s: %s", e.__class__.__name__, e)
        return []


CONTEXT = _Context()


@worker_process_init.connect
def _fresh_engine_in_child(**_: Any) -> None:
    CONTEXT.reset()


def register_tasks(app: Celery, settings: Settings) -> None:
    """Register the tasks on ``app`` (the worker's), bound to ``settings``."""

    @app.task(name=RUN_JOB, bind=True, acks_late=True, reject_on_worker_lost=True,
              autoretry_for=(TransientError,), retry_backoff=2, retry_backoff_max=60, retry_jitter=True,
              max_retries=10)
    def run_job(self: Any, job_id: str) -> str:
        try:
            ident = uuid.UUID(job_id)
        except (ValueError, TypeError):
            log.error("run_job: %r is not a job id; dropping the message", job_id)
            return "invalid"
        top_up(settings)
        outcome = execute_job(ident, CONTEXT.session_factory(settings), settings)
        settle_after(ident, CONTEXT.session_factory(settings))
        return outcome.value

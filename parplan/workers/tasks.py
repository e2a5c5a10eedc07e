"""Celery tasks: thin wrappers that take an id and call the shared execution code."""

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
from parplan.service.settings import Settings
from parplan.workers.celery_app import RUN_JOB
from parplan.workers.execute import TransientError, execute_job

log = logging.getLogger("parplan.workers")


class _Context:
    """The database engine of this worker process, made on first use (after the pool forks)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._engine: Engine | None = None
        self._factory: sessionmaker[Session] | None = None

    def session_factory(self, settings: Settings) -> sessionmaker[Session]:
        with self._lock:
            if self._factory is None:
                self._engine = make_engine(settings.resolved_database_url, pool_size=2, max_overflow=2)
                self._factory = make_session_factory(self._engine)
            return self._factory

    def reset(self) -> None:
        with self._lock:
            if self._engine is not None:
                self._engine.dispose(close=False)
            self._engine, self._factory = None, None


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
        return execute_job(ident, CONTEXT.session_factory(settings), settings).value

"""Celery over Redis: the app, its configuration, and the job queue the API uses with it.

Reliability settings: ``acks_late`` (a message is acknowledged only after its task returns),
``reject_on_worker_lost`` (a pool process that dies mid-task puts its message back),
prefetch 1 (a worker holds no more messages than it runs). Messages carry only a job id; a lost
message (Redis restarted with no persistence) is recovered by the sweeper from the database.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from typing import Any

import redis
from celery import Celery

from parplan.service.settings import Settings

log = logging.getLogger("parplan.workers")

RUN_JOB = "parplan.run_job"


def make_celery(settings: Settings) -> Celery:
    if not settings.broker_url:
        raise ValueError("PARPLAN_BROKER_URL is not set")
    app = Celery("parplan", broker=settings.broker_url, set_as_current=False)
    app.conf.update(
        task_default_queue=settings.queue_name,
        task_serializer="json", accept_content=["json"],
        task_ignore_result=True, result_backend=None,
        task_acks_late=True, task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        worker_send_task_events=False, task_send_sent_event=False,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        broker_connection_timeout=3,
        broker_transport_options={
            # A message not acknowledged for this long is delivered again. Solves are much shorter;
            # workers that die are covered sooner by the job lease and the sweeper.
            "visibility_timeout": 4 * 3600,
            "socket_connect_timeout": 2,
        },
        broker_pool_limit=10,
    )
    return app


class CeleryJobQueue:
    """Enqueue job ids to the Celery queue in Redis."""

    kind = "celery"
    fair = False
    deduplicates = False

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.app = make_celery(settings)
        assert settings.broker_url
        self._redis: Any = redis.Redis.from_url(settings.broker_url, socket_connect_timeout=1, socket_timeout=2)

    def start(self) -> None:
        pass

    def enqueue(self, job_id: uuid.UUID) -> bool:
        try:
            self.app.send_task(RUN_JOB, args=[str(job_id)], queue=self.settings.queue_name, retry=True,
                               retry_policy={"max_retries": 2, "interval_start": 0.1, "interval_step": 0.3,
                                             "interval_max": 0.5})
            return True
        except Exception as e:  # broker down: the job stays queued in the DB and the sweeper re-sends it
            log.warning("could not enqueue job %s (%s: %s); the sweeper will retry", job_id,
                        e.__class__.__name__, e)
            return False

    def depth(self) -> int | None:
        try:
            return int(self._redis.llen(self.settings.queue_name))
        except redis.RedisError:
            return None

    def ping(self) -> bool:
        try:
            return bool(self._redis.ping())
        except redis.RedisError:
            return False

    def purge(self) -> None:
        """Drop every waiting message (tests, operators)."""
        self._redis.delete(self.settings.queue_name)

    def close(self) -> None:
        with contextlib.suppress(redis.RedisError):
            self._redis.close()

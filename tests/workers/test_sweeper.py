"""The sweeper: re-queues running jobs past their lease, fails jobs out of attempts, re-sends queued
jobs whose broker message is gone (counting what Redis still holds), and frees abandoned validations."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from parplan.service.database import utcnow
from parplan.service.models import Job
from parplan.service.settings import Settings
from parplan.service.sweeper import sweep
from parplan.workers.celery_app import CeleryJobQueue
from tests.support.service import insert_job, load_job

SF = sessionmaker[Session]


def job(sf: SF, **fields: Any) -> uuid.UUID:
    return insert_job(sf, {"model": {"preset": "bert-large"}, "cluster": {"gpus": 2}}, "h", uuid.uuid4().hex,
                      **fields)


def ago(seconds: float) -> Any:
    return utcnow() - timedelta(seconds=seconds)


def test_a_running_job_past_its_lease_is_requeued_and_enqueued(db: SF, settings: Settings,
                                                               queue: CeleryJobQueue) -> None:
    dead = job(db, status="running", lease_owner="w1", worker="host:1", attempts=1, deadline_at=ago(1))
    alive = job(db, status="running", lease_owner="w2", attempts=1, deadline_at=utcnow() + timedelta(seconds=30))
    report = sweep(db, queue, settings)
    assert report.requeued_running == [str(dead)]
    j = load_job(db, dead)
    assert j.status == "queued" and j.lease_owner is None and j.attempts == 1 and j.progress_stage == "requeued"
    assert load_job(db, alive).status == "running"
    assert queue.depth() == 1
    assert sweep(db, queue, settings).empty  # nothing left to do


def test_a_job_out_of_attempts_fails(db: SF, settings: Settings, queue: CeleryJobQueue) -> None:
    jid = job(db, status="running", lease_owner="w", worker="host:9", attempts=settings.job_max_attempts,
              deadline_at=ago(1))
    assert sweep(db, queue, settings).failed == [str(jid)]
    j = load_job(db, jid)
    assert j.status == "failed" and j.error is not None and j.error["code"] == "worker-lost"
    assert "host:9" in j.error["message"] and queue.depth() == 0


def test_a_cancelled_job_whose_worker_died_is_cancelled(db: SF, settings: Settings, queue: CeleryJobQueue) -> None:
    jid = job(db, status="running", lease_owner="w", attempts=1, deadline_at=ago(1), cancel_requested=True)
    assert sweep(db, queue, settings).cancelled == [str(jid)]
    assert load_job(db, jid).status == "cancelled" and queue.depth() == 0


def test_stale_queued_jobs_are_resent_only_when_their_messages_are_missing(db: SF, settings: Settings,
                                                                            queue: CeleryJobQueue) -> None:
    fresh = job(db)
    stale = [job(db, enqueued_at=ago(10), created_at=ago(20 - i)) for i in range(3)]
    # Redis holds one message (say, for the oldest): three stale + one fresh queued, one message → resend 3.
    queue.enqueue(stale[0])
    report = sweep(db, queue, settings)
    assert len(report.resent_queued) == 3 and str(fresh) not in report.resent_queued
    assert queue.depth() == 4
    # Now every queued job has a message: even once stale again, nothing is re-sent.
    with db() as s:
        for jid in stale:
            s.get(Job, jid).enqueued_at = ago(10)  # type: ignore[union-attr]
        s.commit()
    assert sweep(db, queue, settings).resent_queued == []
    assert queue.depth() == 4


def test_after_the_broker_lost_everything_all_stale_jobs_are_resent(db: SF, settings: Settings,
                                                                    queue: CeleryJobQueue) -> None:
    ids = [job(db, enqueued_at=ago(10)) for _ in range(4)]
    queue.purge()
    report = sweep(db, queue, settings)
    assert sorted(report.resent_queued) == sorted(map(str, ids)) and queue.depth() == 4
    assert all(load_job(db, j).enqueued_at > ago(1) for j in ids)  # type: ignore[operator]

"""A Celery worker that hangs without dying (SIGSTOP): its job's lease runs out, the sweeper in
``parplan serve`` puts the job back in the queue, and another worker finishes it. When the hung
worker resumes (SIGCONT) it still holds the old message and the old solve, but every write it
tries is fenced by the lease owner token of its claim: it stores nothing, and the result stays
the one the second worker wrote."""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta

import httpx
from private_postgres import wait_until
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from parplan.service.auth.service import Scope
from parplan.service.database import utcnow
from parplan.service.jobs.repository import JobRepository, Lease
from parplan.service.models import Job, JobEvent, JobStatus, Plan
from tests.support.service import (
    MEDIUM_REQUEST,
    Proc,
    finished,
    insert_job,
    load_job,
    make_token,
    poll_job,
    service_env,
    settings_env,
    solver_children,
    start_server,
    start_worker,
)

SF = sessionmaker[Session]
#: Seconds a job's lease lasts: the heartbeat renews it every second, so only a worker that has
#: stopped for this long loses its job (a loaded 2-core machine lags by up to ~2 s).
LEASE_SECONDS = 4


@contextlib.contextmanager
def stopped(group: int) -> Iterator[None]:
    """The process group ``group`` stopped (SIGSTOP) inside the block, and always continued after."""
    os.killpg(group, signal.SIGSTOP)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGCONT)


def _pgid_of_worker(row_worker: str | None) -> int:
    """The process group of the Celery pool process named in ``jobs.worker`` (``host:pid``)."""
    assert row_worker is not None
    return os.getpgid(int(row_worker.rsplit(":", 1)[1]))


def _events(sf: SF, job_id: uuid.UUID) -> list[str]:
    with sf() as s:
        return list(s.scalars(select(JobEvent.status).where(JobEvent.job_id == job_id).order_by(JobEvent.id)))


def test_a_hung_worker_loses_its_job_and_cannot_overwrite_the_result(
        pg_url: str, redis_url: str, queue_name: str, procs: list[Proc], committed_db: SF) -> None:
    env = service_env(settings_env(pg_url, redis_url, queue_name, job_lease_seconds=LEASE_SECONDS))
    server, base = start_server(env)
    procs.append(server)
    # Two idle workers on one queue: whichever claims the job is made to hang, the other rescues it.
    workers = [start_worker(env), start_worker(env)]
    procs.extend(workers)
    token = make_token(committed_db, Scope.PLANS_WRITE)
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30) as c:
        r = c.post("/v1/plans", json=MEDIUM_REQUEST)
        job_id, url = uuid.UUID(r.json()["job"]["id"]), r.headers["location"]
        wait_until(lambda: load_job(committed_db, job_id).status == "running", 60, "the job starting")
        first = load_job(committed_db, job_id)
        hung, rescuer = sorted(workers, key=lambda w: w.pid != _pgid_of_worker(first.worker))
        wait_until(lambda: solver_children(hung.pid), 10, "the hung worker's solver starting", interval=0.01)
        first = load_job(committed_db, job_id)
        assert first.status == "running" and first.attempts == 1 and _pgid_of_worker(first.worker) == hung.pid, (
            f"the job finished or moved before the hang; MEDIUM_REQUEST has become too fast: {first.status}")

        with stopped(hung.pid):  # Celery's main and pool processes; the solver child (own session) runs on
            done = poll_job(c, url, finished, timeout=90)
            assert done["status"] == "succeeded" and done["attempts"] == 2, done
            result = load_job(committed_db, job_id)
            assert _pgid_of_worker(result.worker) == rescuer.pid  # the other worker finished it

        # Resumed, the hung worker finds its lease gone: its task ends as "lost" and writes nothing.
        hung.wait_for_output("'lost'", timeout=30)
        assert "lease lost" in hung.output()
        after = load_job(committed_db, job_id)
        assert (after.status, after.worker, after.plan_id, after.finished_at, after.attempts, after.lease_owner) == (
            result.status, result.worker, result.plan_id, result.finished_at, result.attempts, result.lease_owner)
        assert c.get(url).json()["job"] == done

    statuses = _events(committed_db, job_id)
    # Claimed, requeued by the sweeper after the lease, claimed again, finished once.
    assert statuses[0] == "queued" and statuses[-1] == "succeeded" and statuses.count("succeeded") == 1, statuses
    assert "queued" in statuses[statuses.index("running"):], statuses
    with committed_db() as s:
        assert s.scalar(select(func.count()).select_from(Job)) == 1
        assert s.scalar(select(func.count()).select_from(Plan)) == 1



def test_every_write_of_a_lapsed_lease_is_refused(db: SF) -> None:
    """The fence the resumed worker meets, on each path it may take (renew, store the plan and
    finish, fail, release on shutdown), before and after the new owner finished the job."""
    jid = insert_job(db, MEDIUM_REQUEST, "hash", "key")
    t0 = utcnow()
    with db() as s:
        jobs = JobRepository(s)
        assert jobs.claim(jid, "hung", "host:1", t0, LEASE_SECONDS, 3) is not None
        assert jobs.requeue_expired(jid, t0 + timedelta(seconds=LEASE_SECONDS + 1))  # the sweeper
        assert jobs.claim(jid, "rescuer", "host:2", t0 + timedelta(seconds=LEASE_SECONDS + 1), LEASE_SECONDS, 3)
        s.commit()

    def stale_writes_refused(at: datetime) -> None:
        with db() as s:
            jobs = JobRepository(s)
            assert jobs.renew(jid, "hung", at, LEASE_SECONDS, ("solving", 0.5)) == Lease(owned=False,
                                                                                         cancel_requested=False)
            assert not jobs.finish(jid, "hung", JobStatus.SUCCEEDED, at, plan_id=None, solve_seconds=1.0)
            assert not jobs.finish(jid, "hung", JobStatus.FAILED, at, error={"code": "x", "type": "X", "message": ""})
            assert not jobs.release(jid, "hung", at)
            s.commit()

    stale_writes_refused(t0 + timedelta(seconds=LEASE_SECONDS + 2))
    running = load_job(db, jid)
    assert (running.status, running.lease_owner, running.worker, running.attempts) == ("running", "rescuer",
                                                                                       "host:2", 2)
    done_at = t0 + timedelta(seconds=LEASE_SECONDS + 3)
    with db() as s:
        assert JobRepository(s).finish(jid, "rescuer", JobStatus.SUCCEEDED, done_at, solve_seconds=2.0)
        s.commit()
    stale_writes_refused(done_at + timedelta(seconds=1))
    done = load_job(db, jid)
    assert (done.status, done.finished_at, done.solve_seconds, done.error) == ("succeeded", done_at, 2.0, None)
    assert _events(db, jid).count("succeeded") == 1

"""The embedded default's executor: jobs run in solver child processes behind a thread pool."""

from __future__ import annotations

import os
import time
import uuid
from datetime import timedelta

from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from parplan.service.database import utcnow
from parplan.service.jobs.repository import JobRepository
from parplan.service.models import Job, JobStatus
from parplan.service.settings import Settings
from parplan.workers.inprocess import InProcessJobQueue
from parplan.workers.solve_process import ORPHANED, SolveProcess
from tests.support.service import FAST_REQUEST, SLOW_REQUEST

SF = sessionmaker[Session]


def add(sf: SF, body: dict[str, object]) -> uuid.UUID:
    now = utcnow()
    with sf() as s:
        j = Job(status="queued", request=body, request_hash="h", cache_key=uuid.uuid4().hex, progress_fraction=0.0,
                attempts=0, created_at=now, updated_at=now, enqueued_at=now)
        s.add(j)
        s.commit()
        return j.id


def wait(sf: SF, jid: uuid.UUID, want: set[str], timeout: float = 60) -> Job:
    deadline = time.monotonic() + timeout
    while True:
        with sf() as s:
            j = s.get(Job, jid)
            assert j is not None
            if j.status in want:
                return j
        assert time.monotonic() < deadline, j.status
        time.sleep(0.05)


def test_jobs_run_and_duplicates_are_ignored(committed_db: SF, settings: Settings) -> None:
    q = InProcessJobQueue(settings.model_copy(update={"executor_workers": 1}), committed_db)
    q.start()
    try:
        jid = add(committed_db, FAST_REQUEST)
        assert q.enqueue(jid) and q.enqueue(jid)
        assert wait(committed_db, jid, {"succeeded", "failed"}).status == "succeeded"
        assert q.ping() and q.depth() == 0
    finally:
        q.close()
    assert not q.ping() and not q.enqueue(jid)


def test_closing_releases_running_jobs(committed_db: SF, settings: Settings) -> None:
    q = InProcessJobQueue(settings, committed_db)
    q.start()
    jid = add(committed_db, SLOW_REQUEST)
    q.enqueue(jid)
    wait(committed_db, jid, {JobStatus.RUNNING.value})
    q.close()
    j = wait(committed_db, jid, {JobStatus.QUEUED.value}, timeout=5)
    assert j.lease_owner is None and j.attempts == 0


def test_an_orphaned_solver_exits_when_its_parent_goes_away() -> None:
    proc = SolveProcess(SLOW_REQUEST, None)
    assert proc.read(timeout=10)  # running: it reported progress
    proc._stdin.close()  # what the parent's death looks like from the child
    t0 = time.monotonic()
    while not proc.finished:
        proc.read(timeout=0.1)
        assert time.monotonic() - t0 < 5
    assert proc._proc.returncode == ORPHANED
    proc.close()


def test_a_solver_runs_at_a_lower_cpu_priority_than_its_worker() -> None:
    """Settings.solver_nice: the child lowers its own priority before it solves (the API first)."""
    proc = SolveProcess(SLOW_REQUEST, None, nice=7)
    try:
        assert proc.read(timeout=10)  # running: it reported progress, so it has set its priority
        assert os.getpriority(os.PRIO_PROCESS, proc.pid) == os.getpriority(os.PRIO_PROCESS, 0) + 7
    finally:
        proc.kill()
        proc.close()


def test_kill_terminates_a_solve() -> None:
    proc = SolveProcess(SLOW_REQUEST, None)
    proc.read(timeout=10)
    t0 = time.monotonic()
    proc.kill()
    assert time.monotonic() - t0 < 3 and proc._proc.returncode is not None


def test_a_job_requeued_while_its_old_attempt_winds_down_runs_again(committed_db: SF, settings: Settings) -> None:
    """The sweeper may requeue and re-enqueue a job whose attempt still runs here (its lease lapsed
    while the disk was full or the database down): that attempt then finds its lease gone and
    stops, and the job must run again at once, not wait for the sweeper's next resend."""
    q = InProcessJobQueue(settings.model_copy(update={"executor_workers": 1}), committed_db)
    q.start()
    try:
        jid = add(committed_db, SLOW_REQUEST)
        q.enqueue(jid)
        wait(committed_db, jid, {JobStatus.RUNNING.value})
        with committed_db() as s:  # what the sweeper does to a job past its lease, then it enqueues it
            s.execute(update(Job).where(Job.id == jid).values(deadline_at=utcnow() - timedelta(seconds=1)))
            assert JobRepository(s).requeue_expired(jid, utcnow())
            s.commit()
        assert q.enqueue(jid)
        deadline = time.monotonic() + 30
        while (job := wait(committed_db, jid, {JobStatus.RUNNING.value, JobStatus.QUEUED.value})).attempts < 2:
            assert time.monotonic() < deadline, f"not run again: {job.status}, attempt {job.attempts}"
            time.sleep(0.05)
        assert job.status == JobStatus.RUNNING.value
    finally:
        q.close()

"""execute_job: claim, solve in a child process, progress, store; idempotent; leases; cancel."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from parplan.service.database import utcnow
from parplan.service.jobs.repository import JobRepository
from parplan.service.models import Job, Plan
from parplan.service.plans.service import cache_key
from parplan.service.settings import Settings
from parplan.solver.request import request_hash
from parplan.workers.execute import Outcome, execute_job
from tests.support.service import FAST_REQUEST, SLOW_REQUEST, insert_job, load_job

SF = sessionmaker[Session]


def add_job(sf: SF, body: dict[str, Any], calibration: dict[str, Any] | None = None, **fields: Any) -> uuid.UUID:
    rh = request_hash(body)
    return insert_job(sf, body, rh, cache_key(rh, calibration), calibration=calibration, **fields)


def test_a_job_is_solved_and_its_plan_stored(db: SF, settings: Settings) -> None:
    jid = add_job(db, FAST_REQUEST)
    assert execute_job(jid, db, settings) is Outcome.SUCCEEDED
    job = load_job(db, jid)
    assert job.status == "succeeded" and job.attempts == 1 and job.error is None
    assert (job.progress_stage, job.progress_fraction) == ("done", 1.0)
    assert job.started_at and job.finished_at and job.solve_seconds and job.solve_seconds > 0
    assert job.lease_owner and job.deadline_at is None
    with db() as s:
        plan = s.get(Plan, job.plan_id)
        assert plan is not None and plan.cache_key == job.cache_key and plan.request == FAST_REQUEST
        doc = plan.document
        assert {"memory", "time", "strategy", "baselines", "solver"} <= set(doc)
        assert doc["memory"]["peak_bytes"] > 0 and plan.calibration_source == "default"


def test_running_it_again_is_a_no_op(db: SF, settings: Settings) -> None:
    jid = add_job(db, FAST_REQUEST)
    assert execute_job(jid, db, settings) is Outcome.SUCCEEDED
    assert execute_job(jid, db, settings) is Outcome.SKIPPED
    assert execute_job(uuid.uuid4(), db, settings) is Outcome.SKIPPED
    with db() as s:
        assert s.scalar(select(func.count()).select_from(Plan)) == 1
        assert load_job(db, jid).attempts == 1


def test_a_second_job_for_a_solved_request_reuses_the_plan(db: SF, settings: Settings) -> None:
    a, b = add_job(db, FAST_REQUEST), add_job(db, FAST_REQUEST)
    assert execute_job(a, db, settings) is Outcome.SUCCEEDED
    assert execute_job(b, db, settings) is Outcome.SUCCEEDED
    assert load_job(db, a).plan_id == load_job(db, b).plan_id and load_job(db, b).solve_seconds is None


def test_the_calibration_is_used_and_named(db: SF, settings: Settings) -> None:
    cal = {"matmul_efficiency": {"bf16": 0.3}, "memory_efficiency": 0.5, "intra_node": None, "inter_node": None,
           "source": "agent:A100-80GB@test"}
    plain, calibrated = add_job(db, FAST_REQUEST), add_job(db, FAST_REQUEST, calibration=cal)
    for jid in (plain, calibrated):
        assert execute_job(jid, db, settings) is Outcome.SUCCEEDED
    with db() as s:
        p0, p1 = (s.get(Plan, load_job(db, j).plan_id) for j in (plain, calibrated))
        assert p0 is not None and p1 is not None and p0.id != p1.id
        assert p1.calibration_source == "agent:A100-80GB@test" == p1.document["time"]["calibration"]
        assert p1.document["time"]["step_seconds"] > p0.document["time"]["step_seconds"]  # 30 % vs 55 % of peak


def test_a_solver_error_fails_the_job(db: SF, settings: Settings) -> None:
    jid = add_job(db, FAST_REQUEST, calibration={"memory_efficiency": 7})
    assert execute_job(jid, db, settings) is Outcome.FAILED
    job = load_job(db, jid)
    assert job.status == "failed" and job.error is not None and job.error["code"] == "unsolvable"
    assert "memory_efficiency" in job.error["message"] and job.plan_id is None


def test_a_job_held_by_a_live_worker_is_left_alone(db: SF, settings: Settings) -> None:
    later = utcnow() + timedelta(minutes=5)
    jid = add_job(db, FAST_REQUEST, status="running", lease_owner="other", deadline_at=later, attempts=1)
    assert execute_job(jid, db, settings) is Outcome.SKIPPED
    with db() as s:  # its lease runs out: the next delivery takes over
        s.execute(update(Job).where(Job.id == jid).values(deadline_at=utcnow() - timedelta(seconds=1)))
        s.commit()
    assert execute_job(jid, db, settings) is Outcome.SUCCEEDED
    assert load_job(db, jid).attempts == 2


def test_no_claim_past_the_attempt_limit(db: SF, settings: Settings) -> None:
    jid = add_job(db, FAST_REQUEST, status="running", lease_owner="x", attempts=3,
                  deadline_at=utcnow() - timedelta(seconds=1))
    assert execute_job(jid, db, settings) is Outcome.SKIPPED


def _in_thread(fn: Callable[[], Outcome]) -> tuple[ThreadPoolExecutor, Future[Outcome]]:
    pool = ThreadPoolExecutor(1)
    return pool, pool.submit(fn)


def _wait_running(sf: SF, jid: uuid.UUID, timeout: float = 30) -> Job:
    deadline = time.monotonic() + timeout
    while (job := load_job(sf, jid)).status != "running" or job.progress_stage == "starting":
        assert time.monotonic() < deadline, job.status
        time.sleep(0.02)
    return job


def test_cancel_stops_a_running_solve(committed_db: SF, settings: Settings) -> None:
    jid = add_job(committed_db, SLOW_REQUEST)
    pool, fut = _in_thread(lambda: execute_job(jid, committed_db, settings))
    try:
        _wait_running(committed_db, jid)
        t0 = time.monotonic()
        with committed_db() as s:
            JobRepository(s).request_cancel(jid, utcnow())
            s.commit()
        assert fut.result(timeout=15) is Outcome.CANCELLED
        assert time.monotonic() - t0 < 5
    finally:
        pool.shutdown()
    job = load_job(committed_db, jid)
    assert job.status == "cancelled" and job.plan_id is None and job.error and job.error["code"] == "cancelled"


def test_a_worker_that_lost_its_lease_writes_nothing(committed_db: SF, settings: Settings) -> None:
    jid = add_job(committed_db, SLOW_REQUEST)
    pool, fut = _in_thread(lambda: execute_job(jid, committed_db, settings))
    try:
        _wait_running(committed_db, jid)
        with committed_db() as s:  # as if the sweeper had re-queued it and another worker claimed it
            s.execute(update(Job).where(Job.id == jid).values(lease_owner="someone-else"))
            s.commit()
        assert fut.result(timeout=15) is Outcome.LOST
    finally:
        pool.shutdown()
    job = load_job(committed_db, jid)
    assert job.status == "running" and job.lease_owner == "someone-else" and job.plan_id is None


def test_stopping_releases_the_job(committed_db: SF, settings: Settings) -> None:
    jid = add_job(committed_db, SLOW_REQUEST)
    stop = threading.Event()
    pool, fut = _in_thread(lambda: execute_job(jid, committed_db, settings, stop=stop))
    try:
        _wait_running(committed_db, jid)
        stop.set()
        assert fut.result(timeout=15) is Outcome.RELEASED
    finally:
        pool.shutdown()
    job = load_job(committed_db, jid)
    assert job.status == "queued" and job.attempts == 0 and job.lease_owner is None


def _cancel(sf: SF, jid: uuid.UUID) -> None:
    with sf() as s:
        JobRepository(s).request_cancel(jid, utcnow())
        s.commit()


def test_progress_and_lease_are_renewed_while_solving(committed_db: SF, settings: Settings) -> None:
    jid = add_job(committed_db, SLOW_REQUEST)
    pool, fut = _in_thread(lambda: execute_job(jid, committed_db, settings))
    seen: list[tuple[str | None, float, Any]] = []
    try:
        deadline = time.monotonic() + 60
        while not fut.done() and time.monotonic() < deadline:
            job = load_job(committed_db, jid)
            seen.append((job.progress_stage, job.progress_fraction, job.deadline_at))
            if len({d for _, _, d in seen if d is not None}) >= 3 and len({f for _, f, _ in seen}) >= 2:
                break
            time.sleep(0.05)
        _cancel(committed_db, jid)
        assert fut.result(timeout=15) in (Outcome.CANCELLED, Outcome.SUCCEEDED)
    finally:
        pool.shutdown()
    stages = [st for st, _, _ in seen]
    assert "starting" in stages and set(stages) & {"building", "baselines", "search", "done"}, seen
    fractions = [f for _, f, _ in seen]
    assert fractions == sorted(fractions) and fractions[-1] > 0
    deadlines = [d for _, _, d in seen if d is not None]
    assert deadlines == sorted(deadlines) and len(set(deadlines)) >= 2  # the lease was renewed

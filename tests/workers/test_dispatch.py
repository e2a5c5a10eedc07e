"""Fair scheduling in the Celery layout: the dispatcher keeps the broker's queue short and releases
the jobs waiting in the database in turn by token; nothing is lost when a message is; and with a
real worker, a small client's jobs finish before most of a large burst submitted ahead of them."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from parplan.service.auth.service import Scope, create_token
from parplan.service.database import utcnow
from parplan.service.dispatch import Dispatcher, fair_order
from parplan.service.jobs.repository import JobRepository
from parplan.service.models import Job, JobStatus
from parplan.service.settings import Settings
from parplan.service.sweeper import sweep
from parplan.workers.celery_app import CeleryJobQueue
from parplan.workers.tasks import CONTEXT, top_up
from tests.support.service import (
    Proc,
    finished,
    insert_job,
    load_job,
    poll_job,
    service_env,
    settings_env,
    start_server,
    start_worker,
)

SF = sessionmaker[Session]
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def heads(token: str, count: int, first_second: int) -> list[tuple[uuid.UUID, str, dt.datetime]]:
    return [(uuid.UUID(int=first_second + i), token, T0 + dt.timedelta(seconds=first_second + i))
            for i in range(count)]


def test_fair_order_alternates_and_favours_the_token_with_less_in_flight() -> None:
    a, b = heads("A", 20, 0), heads("B", 2, 100)
    ids = {h[0]: f"{h[1]}{i + 1}" for hs in (a, b) for i, h in enumerate(hs)}
    # Nothing in flight: in turn, the older job first on a tie.
    assert [ids[j] for j in fair_order(a + b, {}, 4)] == ["A1", "B1", "A2", "B2"]
    # A has three running: B's two go first, then A's oldest.
    assert [ids[j] for j in fair_order(b + a, {"A": 3}, 3)] == ["B1", "B2", "A1"]
    # More wanted than waiting: all of them, and nothing twice.
    assert sorted(fair_order(a[:2] + b, {}, 10)) == sorted(h[0] for h in a[:2] + b)
    assert fair_order([], {"A": 1}, 4) == []
    # Equal loads: the token served longest ago first (C never was), whatever the age of its jobs.
    c = heads("C", 1, 200)
    assert [ids.get(j, "C1") for j in fair_order(a + b + c, {}, 3, {"A": 5, "B": 3})] == ["C1", "B1", "A1"]


def test_more_tokens_than_slots_are_served_in_turn() -> None:
    """Ten tokens with ten jobs each (submitted token after token), six jobs in flight at a time
    (two running, a window of four), one finishing per step: every token has a job among the first
    ten handed over, and each token's jobs are spread evenly (a token's k-th job goes out in round
    k). Independent of the ordering rule's details: only what a round robin guarantees."""
    waiting = [h for k in range(10) for h in heads(f"T{k}", 10, 100 * k)]
    token_of = {h[0]: h[1] for h in waiting}
    in_flight: list[uuid.UUID] = []
    turns: dict[str, int] = {}
    sent: list[str] = []
    while waiting or in_flight:
        load: dict[str, int] = {}
        for j in in_flight:
            load[token_of[j]] = load.get(token_of[j], 0) + 1
        picked = fair_order(waiting, load, 6 - len(in_flight), turns)
        for j in picked:
            turns[token_of[j]] = len(sent)
            sent.append(token_of[j])
        in_flight += picked
        waiting = [h for h in waiting if h[0] not in picked]
        in_flight.pop(0)  # the oldest in flight finishes
    assert len(sent) == 100 and set(sent[:10]) == {f"T{k}" for k in range(10)}
    for r in range(10):
        assert sorted(sent[10 * r:10 * r + 10]) == sorted(f"T{k}" for k in range(10)), (r, sent)


def _tokens(sf: SF, *names: str) -> list[uuid.UUID]:
    with sf() as s:
        rows = [create_token(s, name, frozenset({Scope.PLANS_WRITE}))[0] for name in names]
        s.commit()
        return [r.id for r in rows]


def _waiting(sf: SF, token: uuid.UUID, count: int) -> list[uuid.UUID]:
    return [insert_job(sf, {}, "h", uuid.uuid4().hex, token_id=token, enqueued_at=None) for _ in range(count)]


@pytest.fixture
def dispatcher(committed_db: SF, settings: Settings, queue: CeleryJobQueue) -> Iterator[Dispatcher]:
    d = Dispatcher(queue, committed_db, settings.model_copy(update={"dispatch_window": 4}))
    yield d
    d._redis.close()


def test_the_broker_holds_a_window_filled_in_turn(committed_db: SF, dispatcher: Dispatcher,
                                                  queue: CeleryJobQueue) -> None:
    a_token, b_token = _tokens(committed_db, "burst", "small")
    a, b = _waiting(committed_db, a_token, 6), _waiting(committed_db, b_token, 2)
    assert dispatcher.dispatch_once() == [a[0], b[0], a[1], b[1]]
    assert queue.depth() == 4 and dispatcher.dispatch_once() == []  # full: nothing more
    assert all(load_job(committed_db, j).enqueued_at is not None for j in (a[0], b[0], a[1], b[1]))
    assert load_job(committed_db, a[2]).enqueued_at is None  # still waiting in the database

    # A worker takes two messages and claims those jobs: two places free up, both for A (B has none left).
    queue._redis.rpop(queue.settings.queue_name)
    queue._redis.rpop(queue.settings.queue_name)
    with committed_db() as s:
        s.execute(update(Job).where(Job.id.in_([a[0], b[0]])).values(status=JobStatus.RUNNING.value))
        s.commit()
    assert dispatcher.dispatch_once() == [a[2], a[3]]


def test_a_new_job_waits_for_the_dispatcher(committed_db: SF, dispatcher: Dispatcher,
                                            queue: CeleryJobQueue) -> None:
    (token,) = _tokens(committed_db, "t")
    job = insert_job(committed_db, {}, "h", uuid.uuid4().hex, token_id=token)  # marked, as the sweeper re-queues
    assert dispatcher.enqueue(job) is True
    assert load_job(committed_db, job).enqueued_at is None and queue.depth() == 0
    assert dispatcher.dispatch_once() == [job] and queue.depth() == 1


def test_a_job_marked_but_never_sent_is_recovered(committed_db: SF, dispatcher: Dispatcher,
                                                  queue: CeleryJobQueue, settings: Settings) -> None:
    """The API died between marking a job and sending it, and Redis lost another's message: the
    sweeper puts both back among the waiting, and the dispatcher sends each once."""
    (token,) = _tokens(committed_db, "t")
    jobs = _waiting(committed_db, token, 3)
    assert dispatcher.dispatch_once() == jobs
    queue.purge()  # Redis restarted empty
    with committed_db() as s:
        assert JobRepository(s).mark_sent(_waiting(committed_db, token, 1)[0], utcnow())  # no message sent
        s.commit()
    report = sweep(committed_db, dispatcher, settings, requeue_after=0)
    assert len(report.resent_queued) == 4
    with committed_db() as s:
        assert s.scalars(select(Job.enqueued_at).where(Job.status == JobStatus.QUEUED.value)).all() == [None] * 4
    assert len(dispatcher.dispatch_once()) == 4 and queue.depth() == 4
    # Nothing is missing now: the sweeper leaves them alone.
    assert sweep(committed_db, dispatcher, settings, requeue_after=0).resent_queued == []


def _take_and_finish(sf: SF, queue: CeleryJobQueue, job_id: uuid.UUID) -> None:
    """What a worker does with the one message in the list: take it, run the job, close it."""
    assert queue._redis.rpop(queue.settings.queue_name) is not None
    with sf() as s:
        s.execute(update(Job).where(Job.id == job_id).values(status=JobStatus.SUCCEEDED.value))
        s.commit()


def test_turns_are_shared_by_every_process_that_dispatches(committed_db: SF, settings: Settings,
                                                           queue: CeleryJobQueue) -> None:
    """Two dispatchers (two processes: an API and a worker, say) take turns with a window of one.
    Every token has as many jobs in flight (none) at each pass, so the round robin alone decides:
    A, B, C, A, B, C, whichever process runs the pass. With turns remembered per process, the
    second process would start with A's older job again."""
    tokens = _tokens(committed_db, "A", "B", "C")
    name = {}
    for label, token in zip("ABC", tokens, strict=True):
        for job in _waiting(committed_db, token, 2):
            name[job] = label
    one = settings.model_copy(update={"dispatch_window": 1})
    d1, d2 = Dispatcher(queue, committed_db, one), Dispatcher(queue, committed_db, one)
    served = []
    try:
        for d in (d1, d2, d1, d2, d1, d2):
            (job,) = d.dispatch_once()
            served.append(name[job])
            _take_and_finish(committed_db, queue, job)
    finally:
        d1._redis.close()
        d2._redis.close()
    assert served == ["A", "B", "C", "A", "B", "C"]


def test_a_worker_starting_a_task_tops_up_the_window(committed_db: SF, settings: Settings,
                                                     queue: CeleryJobQueue) -> None:
    """The task's own pass (no API process runs one): a worker took a message and claimed its job,
    so the window has room for one more, which goes to the token with fewer jobs in flight."""
    a_token, b_token = _tokens(committed_db, "burst", "small")
    a = _waiting(committed_db, a_token, 5)
    s4 = settings.model_copy(update={"dispatch_window": 4})
    CONTEXT.reset()
    try:
        assert top_up(s4) == a[:4] and queue.depth() == 4
        assert top_up(s4) == []  # full
        b = _waiting(committed_db, b_token, 1)
        queue._redis.rpop(queue.settings.queue_name)  # a worker takes A's first message and claims the job
        with committed_db() as s:
            s.execute(update(Job).where(Job.id == a[0]).values(status=JobStatus.RUNNING.value))
            s.commit()
        assert top_up(s4) == b and queue.depth() == 4
        assert top_up(settings.model_copy(update={"dispatch_window": 0})) == []  # first come, first served: none
    finally:
        CONTEXT.reset()


# -- with a real worker ---------------------------------------------------------------------------------

def distinct_request(i: int) -> dict[str, Any]:
    """A fast request of its own (no cache hit): bert-large on 2 GPUs, sequence length 64 + i."""
    return {"model": {"preset": "bert-large"}, "cluster": {"gpus": 2}, "search": "dp",
            "training": {"global_batch": 2, "seq_len": 64 + i}}


def _token(env: dict[str, str], name: str) -> str:
    out = subprocess.run([sys.executable, "-m", "parplan.cli", "token", "create", "--scope", "plans:write",
                          "--name", name], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.mark.slow
def test_a_small_clients_jobs_finish_before_most_of_an_earlier_burst(pg_url: str, redis_url: str, queue_name: str,
                                                                      committed_db: SF, procs: list[Proc]) -> None:
    env = service_env(settings_env(pg_url, redis_url, queue_name, dispatch_window=2,
                                   dispatch_interval_seconds=0.2))
    server, base = start_server(env)
    procs.append(server)
    procs.append(start_worker(env, concurrency=1))
    urls: dict[str, list[str]] = {"A": [], "B": []}
    for name, count, offset in (("A", 20, 0), ("B", 2, 100)):
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {_token(env, name)}"}, timeout=10) as c:
            for i in range(count):
                r = c.post("/v1/plans", json=distinct_request(offset + i))
                assert r.status_code == 202, r.text
                urls[name].append(r.headers["location"])
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {_token(env, 'reader')}"}, timeout=10) as c:
        done = {name: [poll_job(c, u, finished, timeout=300) for u in us] for name, us in urls.items()}
    assert all(j["status"] == "succeeded" for js in done.values() for j in js), done
    for js in done.values():  # each ran once
        assert all(load_job(committed_db, uuid.UUID(j["id"])).attempts == 1 for j in js)
    b_last = max(j["finished_at"] for j in done["B"])
    a_after = [j for j in done["A"] if j["finished_at"] > b_last]
    assert len(a_after) > len(done["A"]) // 2, (b_last, sorted(j["finished_at"] for j in done["A"]))


@pytest.mark.slow
def test_workers_keep_the_window_full_without_the_apis_periodic_pass(pg_url: str, redis_url: str, queue_name: str,
                                                                     committed_db: SF, procs: list[Proc]) -> None:
    """The API's periodic pass is an hour apart, so after the last submission only the workers'
    top-ups (one as each task starts) can hand the waiting jobs over: all of them still run, once."""
    env = service_env(settings_env(pg_url, redis_url, queue_name, dispatch_window=1,
                                   dispatch_interval_seconds=3600))
    server, base = start_server(env)
    procs.append(server)
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {_token(env, 'A')}"}, timeout=10) as c:
        urls = []
        for i in range(5):  # before any worker runs: the first fills the window, the others wait
            r = c.post("/v1/plans", json=distinct_request(200 + i))
            assert r.status_code == 202, r.text
            urls.append(r.headers["location"])
        with committed_db() as s:
            waiting = s.scalars(select(Job.id).where(Job.status == JobStatus.QUEUED.value,
                                                     Job.enqueued_at.is_(None))).all()
        assert len(waiting) == 4
        procs.append(start_worker(env, concurrency=1))
        done = [poll_job(c, u, finished, timeout=300) for u in urls]
    assert [j["status"] for j in done] == ["succeeded"] * 5, done
    assert all(load_job(committed_db, uuid.UUID(j["id"])).attempts == 1 for j in done)

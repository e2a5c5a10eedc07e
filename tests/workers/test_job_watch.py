"""Following a job while it runs, in both layouts: the events stream and the long poll see the
progress a solver writes, whether it runs in the in-process executor of `parplan serve` (SQLite)
or in a Celery worker process (PostgreSQL + Redis)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from parplan.service.testing import (
    FAST_REQUEST,
    MEDIUM_REQUEST,
    Proc,
    finished,
    service_env,
    settings_env,
    start_server,
    start_worker,
)

SF = sessionmaker[Session]


def follow(c: httpx.Client, job_url: str) -> list[tuple[str, dict[str, Any]]]:
    """Every event of the job's stream, until the server closes it. The events arrive as they
    happen: the first one (the job as it is) well before the end."""
    events: list[tuple[str, dict[str, Any]]] = []
    arrived: list[float] = []
    name = None
    with c.stream("GET", job_url + "/events", timeout=httpx.Timeout(10, read=60)) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                assert name is not None
                events.append((name, json.loads(line[6:])))
                arrived.append(time.monotonic())
    assert arrived[-1] - arrived[0] > 0.5, "the stream was delivered at once, not as the job went"
    return events


def check_stream(events: list[tuple[str, dict[str, Any]]], job_id: str) -> None:
    names = [e for e, _ in events]
    assert names[0] == "status" and names[-1] == "end" and names.count("end") == 1, names
    end = events[-1][1]
    assert end["status"] == "succeeded" and end["plan_id"] and end["job"]["id"] == job_id
    statuses = [d["status"] for e, d in events if e == "status"]
    assert statuses[-1] == "succeeded" and "running" in statuses, statuses
    # Progress the solver wrote on its way: more than the claim's "starting" and the final "done".
    stages = {d["progress"]["stage"] for _, d in events[:-1]}
    assert len(stages - {"queued", "starting", "done"}) >= 1, stages


def long_poll_until_done(c: httpx.Client, job_url: str) -> tuple[dict[str, Any], int]:
    """Long-poll until the job ends; the job and how many calls it took. Every answer differs from
    the state the call started from (or the job ended): no call waits out its 30 s."""
    job = c.get(job_url).json()["job"]
    calls = 0
    while not finished(job):
        t0 = time.monotonic()
        nxt = c.get(job_url, params={"wait": 30}, timeout=40).json()["job"]
        calls += 1
        assert time.monotonic() - t0 < 29, "a change was not reported before the wait ran out"
        assert (nxt["status"], nxt["progress"]) != (job["status"], job["progress"])
        job = nxt
    return job, calls


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[str]:
    env = service_env({"PARPLAN_DATA_DIR": str(tmp_path), "PARPLAN_EXECUTOR_WORKERS": "1"})
    server, base = start_server(env)
    try:
        yield base
    finally:
        server.stop()


@pytest.fixture
def celery_stack(pg_url: str, redis_url: str, queue_name: str, committed_db: SF) -> Iterator[tuple[str, str]]:
    env = service_env(settings_env(pg_url, redis_url, queue_name))
    procs: list[Proc] = []
    try:
        server, base = start_server(env)
        procs.append(server)
        procs.append(start_worker(env))
        token = subprocess.run([sys.executable, "-m", "parplan.cli", "token", "create", "--scope", "plans:write"],
                               env=env, capture_output=True, text=True, check=True).stdout.strip()
        yield base, token
    finally:
        for p in procs:
            p.stop()


def test_embedded_events_and_long_poll(embedded: str) -> None:
    with httpx.Client(base_url=embedded, timeout=10) as c:
        url = c.post("/v1/plans", json=MEDIUM_REQUEST).headers["location"]
        events = follow(c, url)
        check_stream(events, url.rsplit("/", 1)[1])
        assert c.get(f"/v1/plans/{events[-1][1]['plan_id']}").status_code == 200

        url = c.post("/v1/plans", json=FAST_REQUEST).headers["location"]
        job, calls = long_poll_until_done(c, url)
        assert job["status"] == "succeeded" and 1 <= calls <= 40


def test_celery_worker_progress_reaches_the_events_and_long_poll(celery_stack: tuple[str, str]) -> None:
    base, token = celery_stack
    with httpx.Client(base_url=base, timeout=10, headers={"Authorization": f"Bearer {token}"}) as c:
        url = c.post("/v1/plans", json=MEDIUM_REQUEST).headers["location"]
        check_stream(follow(c, url), url.rsplit("/", 1)[1])

        url = c.post("/v1/plans", json=FAST_REQUEST).headers["location"]
        job, calls = long_poll_until_done(c, url)
        assert job["status"] == "succeeded" and calls >= 1
        anonymous = httpx.get(base + url + "/events", timeout=5)
        assert anonymous.status_code == 401 and anonymous.headers["content-type"] == "application/problem+json"

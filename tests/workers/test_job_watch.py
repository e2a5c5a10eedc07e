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

from tests.support.service import (
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


Event = tuple[str, int, dict[str, Any]]


def read_events(c: httpx.Client, job_url: str, last_event_id: str | None = None,
                stop_after: int | None = None) -> list[Event]:
    """``(event, id, data)`` of the job's stream until the server closes it, or until
    ``stop_after`` events arrived (then this client drops the connection)."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id is not None else {}
    out: list[Event] = []
    block: dict[str, str] = {}
    with c.stream("GET", job_url + "/events", headers=headers, timeout=httpx.Timeout(10, read=60)) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line:
                key, _, value = line.partition(": ")
                block[key] = value
                continue
            if "data" in block:
                out.append((block["event"], int(block["id"]), json.loads(block["data"])))
            block = {}
            if stop_after is not None and len(out) == stop_after:
                break
    return out


def check_resumption(c: httpx.Client, job_url: str) -> None:
    """Drop the stream after two events (mid-job), reconnect with Last-Event-ID: together the two
    connections carry exactly the job's history from the first event on (every status change and
    every progress write, in order, same ids and documents) and one ``end``; then a finished job's
    stream is its state and ``end``, at once."""
    head = read_events(c, job_url, stop_after=2)
    assert head[-1][2]["status"] != "succeeded", head
    rest = read_events(c, job_url, last_event_id=str(head[-1][1]))
    got = head + rest
    assert [e for e, _, _ in got].count("end") == 1 and got[-1][0] == "end", got
    ids = [i for _, i, _ in got[:-1]]
    assert ids == sorted(set(ids)) and got[-1][1] == ids[-1], ids
    history = read_events(c, job_url, last_event_id="0")
    start = [i for _, i, _ in history].index(head[0][1])
    assert [(i, d) for _, i, d in got[:-1]] == [(i, d) for _, i, d in history[start:-1]]
    statuses = [d["status"] for _, _, d in history[:-1]]
    assert statuses[0] == "queued" and statuses[-1] == "succeeded" and "running" in statuses, statuses
    assert [e for e, _, _ in rest].count("status") >= 1  # the reconnect brought a status change
    t0 = time.monotonic()
    done = read_events(c, job_url)
    assert [(e, i) for e, i, _ in done] == [("status", ids[-1]), ("end", ids[-1])]
    assert time.monotonic() - t0 < 2.0


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


def test_embedded_reconnect_with_last_event_id_misses_nothing(embedded: str) -> None:
    with httpx.Client(base_url=embedded, timeout=10) as c:
        check_resumption(c, c.post("/v1/plans", json=MEDIUM_REQUEST).headers["location"])


def test_celery_reconnect_with_last_event_id_misses_nothing(celery_stack: tuple[str, str]) -> None:
    base, token = celery_stack
    with httpx.Client(base_url=base, timeout=10, headers={"Authorization": f"Bearer {token}"}) as c:
        check_resumption(c, c.post("/v1/plans", json=MEDIUM_REQUEST).headers["location"])

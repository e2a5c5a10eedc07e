"""The long poll (``GET /v1/jobs/{id}?wait=``) and the event stream (``GET /v1/jobs/{id}/events``)
in-process: bounds, errors and finished jobs. Jobs that change while watched are in
tests/workers/test_job_watch.py (a real executor or Celery worker writes the progress)."""

from __future__ import annotations

import json
import time
import uuid

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from parplan.service.database import utcnow
from parplan.service.models import Job, JobStatus

Headers = dict[str, str]


def _job(db: sessionmaker[Session], status: JobStatus, **fields: object) -> str:
    now = utcnow()
    with db() as s:
        values: dict[str, object] = {"progress_stage": "queued", "progress_fraction": 0.0} | fields
        job = Job(status=status.value, request={"model": {"preset": "bert-large"}, "cluster": {"gpus": 2}},
                  request_hash="h", cache_key="h", created_at=now, updated_at=now, attempts=0, **values)
        s.add(job)
        s.commit()
        return str(job.id)


def _events(text: str) -> list[tuple[str, dict[str, object]]]:
    out = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if not line.startswith(":"))
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def test_a_long_poll_on_an_unchanging_job_answers_after_the_wait(client: TestClient, reader: Headers,
                                                                 db: sessionmaker[Session]) -> None:
    jid = _job(db, JobStatus.QUEUED)
    t0 = time.monotonic()
    r = client.get(f"/v1/jobs/{jid}", params={"wait": 0.6}, headers=reader)
    took = time.monotonic() - t0
    assert r.status_code == 200 and r.json()["job"]["status"] == "queued"
    assert 0.6 <= took < 3.0, took


def test_a_long_poll_on_a_finished_job_answers_at_once(client: TestClient, reader: Headers,
                                                       db: sessionmaker[Session]) -> None:
    jid = _job(db, JobStatus.FAILED, error={"code": "unsolvable", "type": "X", "message": "no"})
    t0 = time.monotonic()
    r = client.get(f"/v1/jobs/{jid}", params={"wait": 30}, headers=reader)
    assert r.status_code == 200 and r.json()["job"]["status"] == "failed"
    assert time.monotonic() - t0 < 2.0


def test_the_wait_is_bounded_and_errors_are_problems(client: TestClient, reader: Headers,
                                                     db: sessionmaker[Session]) -> None:
    jid = _job(db, JobStatus.QUEUED)
    r = client.get(f"/v1/jobs/{jid}", params={"wait": 61}, headers=reader)
    assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json"
    assert r.json()["errors"][0]["field"] == "wait"
    r = client.get(f"/v1/jobs/{jid}", params={"wait": "soon"}, headers=reader)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "wait"
    missing = client.get(f"/v1/jobs/{uuid.uuid4()}", params={"wait": 5}, headers=reader)
    assert missing.status_code == 404 and missing.headers["content-type"] == "application/problem+json"


def test_events_of_a_finished_job_are_its_state_then_the_end(client: TestClient, reader: Headers,
                                                             db: sessionmaker[Session]) -> None:
    jid = _job(db, JobStatus.CANCELLED, cancel_requested=True, progress_stage="search")
    with client.stream("GET", f"/v1/jobs/{jid}/events", headers=reader) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["cache-control"] == "no-cache"
        body = r.read().decode()
    events = _events(body)
    assert [e for e, _ in events] == ["status", "end"]
    assert events[0][1]["id"] == jid and events[0][1]["status"] == "cancelled"
    assert events[1][1]["status"] == "cancelled" and events[1][1]["plan_id"] is None
    assert "id: 1\n" in body and "id: 2\n" in body


def test_events_need_the_read_scope_and_an_existing_job(client: TestClient, agent: Headers,
                                                        reader: Headers, db: sessionmaker[Session]) -> None:
    jid = _job(db, JobStatus.QUEUED)
    assert client.get(f"/v1/jobs/{jid}/events").status_code == 401
    forbidden = client.get(f"/v1/jobs/{jid}/events", headers=agent)
    assert forbidden.status_code == 403 and forbidden.headers["content-type"] == "application/problem+json"
    for bad in (uuid.uuid4(), "not-a-uuid"):
        r = client.get(f"/v1/jobs/{bad}/events", headers=reader)
        assert r.status_code == 404 and r.json()["status"] == 404

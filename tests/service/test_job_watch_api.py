"""The long poll (``GET /v1/jobs/{id}?wait=``) and the event stream (``GET /v1/jobs/{id}/events``)
in-process: bounds, errors and finished jobs. Jobs that change while watched are in
tests/workers/test_job_watch.py (a real executor or Celery worker writes the progress)."""

from __future__ import annotations

import json
import time
import uuid
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from parplan.service.database import utcnow
from parplan.service.jobs import watch
from parplan.service.jobs.repository import JobRepository
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
    return [(name, data) for name, _, data in _with_ids(text)]


def _with_ids(text: str) -> list[tuple[str, int, dict[str, object]]]:
    out = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if not line.startswith(":"))
        out.append((lines["event"], int(lines["id"]), json.loads(lines["data"])))
    return out


def _lived_job(db: sessionmaker[Session]) -> str:
    """A job taken through a whole life by the repository, as workers and the sweeper take it:
    queued, claimed, two progress writes, re-queued (its lease expired), claimed again, failed."""
    now = utcnow()
    later = now + timedelta(minutes=5)
    with db() as s:
        repo = JobRepository(s)
        jid = repo.add(Job(status=JobStatus.QUEUED.value, request={"model": {"preset": "bert-large"}},
                           request_hash="h", cache_key="h", progress_stage="queued", progress_fraction=0.0,
                           created_at=now, updated_at=now, attempts=0)).id
        assert repo.claim(jid, "w1", "worker-1", now, 30, 3) is not None
        assert repo.renew(jid, "w1", now, 30, ("search", 0.3)).owned
        assert repo.renew(jid, "w1", now, 30, None).owned  # a heartbeat without progress: no event
        assert repo.renew(jid, "w1", now, 30, ("search", 0.6)).owned
        assert repo.requeue_expired(jid, later)
        assert repo.claim(jid, "w2", "worker-2", later, 30, 3) is not None
        assert repo.finish(jid, "w2", JobStatus.FAILED, later, error={"code": "unsolvable", "type": "X",
                                                                      "message": "no"})
        s.commit()
        return str(jid)


def _stream(client: TestClient, jid: str, headers: Headers, last_event_id: str | None = None) -> str:
    sent: dict[str, str | bytes] = dict(headers)
    if last_event_id is not None:  # as bytes: a header may carry any Latin-1 text
        sent["Last-Event-ID"] = last_event_id.encode("latin-1")
    with client.stream("GET", f"/v1/jobs/{jid}/events", headers=sent) as r:
        assert r.status_code == 200
        return r.read().decode()


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
    assert body.count("id: 0\n") == 2  # a job without history (inserted directly): its row, id 0


def test_events_need_the_read_scope_and_an_existing_job(client: TestClient, agent: Headers,
                                                        reader: Headers, db: sessionmaker[Session]) -> None:
    jid = _job(db, JobStatus.QUEUED)
    assert client.get(f"/v1/jobs/{jid}/events").status_code == 401
    forbidden = client.get(f"/v1/jobs/{jid}/events", headers=agent)
    assert forbidden.status_code == 403 and forbidden.headers["content-type"] == "application/problem+json"
    for bad in (uuid.uuid4(), "not-a-uuid"):
        r = client.get(f"/v1/jobs/{bad}/events", headers=reader)
        assert r.status_code == 404 and r.json()["status"] == 404


def test_event_ids_order_the_whole_history(client: TestClient, reader: Headers, db: sessionmaker[Session]) -> None:
    jid = _lived_job(db)
    replay = _with_ids(_stream(client, jid, reader, "0"))
    names = [n for n, _, _ in replay]
    assert names == ["status", "status", "progress", "progress", "status", "status", "status", "end"], names
    ids = [i for _, i, _ in replay]
    assert ids[:-1] == sorted(set(ids[:-1])) and ids[-1] == ids[-2], ids  # increasing; end repeats the last
    assert [d["status"] for _, _, d in replay[:-1]] == ["queued", "running", "running", "running", "queued",
                                                        "running", "failed"]
    assert [d["progress"]["fraction"] for _, _, d in replay[2:4]] == [0.3, 0.6]  # type: ignore[index]
    assert replay[-1][2]["status"] == "failed" and replay[-1][2]["error"]["code"] == "unsolvable"  # type: ignore[index]
    # Without Last-Event-ID: the state now (the last event), then the end, at once.
    t0 = time.monotonic()
    now = _with_ids(_stream(client, jid, reader))
    assert [(n, i) for n, i, _ in now] == [("status", ids[-1]), ("end", ids[-1])]
    assert time.monotonic() - t0 < 2.0


def test_a_reconnect_with_last_event_id_gets_every_later_event(client: TestClient, reader: Headers,
                                                                db: sessionmaker[Session]) -> None:
    jid = _lived_job(db)
    full = _with_ids(_stream(client, jid, reader, "0"))
    ids = [i for _, i, _ in full[:-1]]
    for k, seen in enumerate(ids):
        resumed = _with_ids(_stream(client, jid, reader, str(seen)))
        assert [i for _, i, _ in resumed] == [*ids[k + 1:], ids[-1]], (seen, resumed)
        assert [d for _, _, d in resumed] == [d for _, _, d in full[k + 1:]]
        assert resumed[0][0] == ("end" if seen == ids[-1] else "status")  # a resumed stream opens with a status
    # A Last-Event-ID that is not an integer is ignored: the stream starts from the state now.
    for odd in ("soon", "-1", "\u00b2", "1.5"):
        assert [(n, i) for n, i, _ in _with_ids(_stream(client, jid, reader, odd))] == [("status", ids[-1]),
                                                                                        ("end", ids[-1])], odd
    # One past every id (even past a BIGINT): nothing to replay, the end at once.
    for big in (str(ids[-1] + 1), "9" * 30):
        assert [(n, i) for n, i, _ in _with_ids(_stream(client, jid, reader, big))] == [("end", ids[-1])], big


def test_a_long_history_is_replayed_in_pages_without_gaps(client: TestClient, reader: Headers,
                                                          db: sessionmaker[Session],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    jid = _lived_job(db)
    whole = _with_ids(_stream(client, jid, reader, "0"))
    monkeypatch.setattr(watch, "EVENTS_PER_READ", 1)
    t0 = time.monotonic()
    paged = _with_ids(_stream(client, jid, reader, "0"))
    assert paged == whole and len(paged) == 8
    assert time.monotonic() - t0 < watch.POLL_SECONDS * 3  # full pages are read on without a pause

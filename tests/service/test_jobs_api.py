"""GET /v1/jobs/{id}, GET /v1/jobs (status filter, cursor pagination), POST /v1/jobs/{id}/cancel."""

from __future__ import annotations

import uuid
from datetime import timedelta

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from parplan.service.database import utcnow
from parplan.service.models import Job, JobStatus

Headers = dict[str, str]


def _jobs(db: sessionmaker[Session], statuses: list[JobStatus]) -> list[str]:
    ids = []
    base = utcnow()
    with db() as s:
        for i, st in enumerate(statuses):
            t = base + timedelta(seconds=i)
            job = Job(status=st.value, request={"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": 8}},
                      request_hash=f"h{i}", cache_key=f"h{i}", progress_stage="queued", progress_fraction=0.0,
                      created_at=t, updated_at=t, attempts=0)
            s.add(job)
            s.flush()
            ids.append(str(job.id))
        s.commit()
    return ids


def test_read_job(client: TestClient, reader: Headers, db: sessionmaker[Session]) -> None:
    (jid,) = _jobs(db, [JobStatus.QUEUED])
    job = client.get(f"/v1/jobs/{jid}", headers=reader).json()["job"]
    assert job["id"] == jid and job["status"] == "queued" and job["url"] == f"/v1/jobs/{jid}"
    assert set(job) >= {"id", "status", "progress", "plan_id", "error", "created_at", "started_at", "finished_at"}
    assert client.get(f"/v1/jobs/{uuid.uuid4()}", headers=reader).status_code == 404


def test_list_pages_newest_first_with_a_status_filter(client: TestClient, reader: Headers,
                                                      db: sessionmaker[Session]) -> None:
    ids = _jobs(db, [JobStatus.QUEUED, JobStatus.SUCCEEDED, JobStatus.QUEUED, JobStatus.FAILED, JobStatus.QUEUED])
    seen, cursor = [], None
    while True:
        r = client.get("/v1/jobs", params={"limit": 2, **({"cursor": cursor} if cursor else {})}, headers=reader)
        page = r.json()
        assert len(page["jobs"]) <= 2
        seen += [j["id"] for j in page["jobs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(ids))
    queued = client.get("/v1/jobs", params={"status": "queued"}, headers=reader).json()
    assert [j["id"] for j in queued["jobs"]] == [ids[4], ids[2], ids[0]] and queued["next_cursor"] is None
    two = client.get("/v1/jobs", params=[("status", "failed"), ("status", "succeeded")], headers=reader).json()
    assert {j["id"] for j in two["jobs"]} == {ids[1], ids[3]}


def test_cancel_a_queued_job(client: TestClient, writer: Headers, db: sessionmaker[Session]) -> None:
    (jid,) = _jobs(db, [JobStatus.QUEUED])
    r = client.post(f"/v1/jobs/{jid}/cancel", headers=writer)
    assert r.status_code == 200 and r.json()["job"]["status"] == "cancelled"
    assert r.json()["job"]["finished_at"] is not None
    again = client.post(f"/v1/jobs/{jid}/cancel", headers=writer)
    assert again.status_code == 409 and again.headers["content-type"] == "application/problem+json"


def test_cancel_a_running_job_flags_it_for_its_worker(client: TestClient, writer: Headers,
                                                      db: sessionmaker[Session]) -> None:
    (jid,) = _jobs(db, [JobStatus.RUNNING])
    r = client.post(f"/v1/jobs/{jid}/cancel", headers=writer)
    assert r.status_code == 202
    job = r.json()["job"]
    assert job["status"] == "running" and job["cancel_requested"] is True


def test_cancel_a_finished_job_is_409(client: TestClient, writer: Headers, db: sessionmaker[Session]) -> None:
    for jid in _jobs(db, [JobStatus.SUCCEEDED, JobStatus.FAILED]):
        assert client.post(f"/v1/jobs/{jid}/cancel", headers=writer).status_code == 409
    assert client.post(f"/v1/jobs/{uuid.uuid4()}/cancel", headers=writer).status_code == 404


def test_a_cancelled_request_can_be_submitted_again(client: TestClient, writer: Headers) -> None:
    body = {"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": 8}}
    first = client.post("/v1/plans", json=body, headers=writer).json()["job"]["id"]
    client.post(f"/v1/jobs/{first}/cancel", headers=writer)
    second = client.post("/v1/plans", json=body, headers=writer)
    assert second.status_code == 202 and second.json()["job"]["id"] != first

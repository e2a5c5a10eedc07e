"""Overload: a rate limit per token, a cap on a token's jobs in flight (429 with Retry-After), a cap
on queued jobs (503 with Retry-After) and a cap on the time limit a request may ask for."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from parplan.service.app import create_app
from parplan.service.auth.service import Scope
from parplan.service.models import Job
from parplan.service.overload import RateLimiter
from parplan.service.runtime import Runtime
from parplan.service.settings import Settings
from parplan.workers.celery_app import CeleryJobQueue

Headers = dict[str, str]
PROBLEM = "application/problem+json"


def _request(gpus: int) -> dict[str, Any]:
    return {"model": {"preset": "bert-large"}, "cluster": {"gpus": gpus}}


@pytest.fixture
def limited(app_client: Callable[..., TestClient], db: sessionmaker[Session]) -> Callable[..., TestClient]:
    """``limited(**settings)``: a client of an app with those settings changed."""
    return lambda **changes: app_client(db, **changes)


def _retry_after(r: Any, status: int) -> int:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == PROBLEM
    seconds = int(r.headers["retry-after"])
    assert seconds >= 1
    return seconds


def test_the_rate_limiter_refills() -> None:
    now = [0.0]
    rl = RateLimiter(rate=2.0, burst=3, clock=lambda: now[0])
    assert [rl.wait_seconds("a") for _ in range(3)] == [0, 0, 0]
    assert rl.wait_seconds("a") == pytest.approx(0.5)
    assert rl.wait_seconds("b") == 0  # keys have buckets of their own
    now[0] = 0.5
    assert rl.wait_seconds("a") == 0 and rl.wait_seconds("a") > 0


def test_each_token_has_its_rate_limit(limited: Callable[..., TestClient], auth: Callable[..., Headers]) -> None:
    c = limited(rate_limit_per_second=0.5, rate_limit_burst=2)
    mine, theirs = auth(Scope.PLANS_READ), auth(Scope.PLANS_READ)
    assert [c.get("/v1/jobs", headers=mine).status_code for _ in range(2)] == [200, 200]
    r = c.get("/v1/jobs", headers=mine)
    assert 1 <= _retry_after(r, 429) <= 2 and "rate limit" in r.json()["detail"]
    assert c.get("/v1/jobs", headers=theirs).status_code == 200
    assert c.get("/healthz").status_code == 200  # health checks are not limited


def test_no_rate_limit_by_default(client: TestClient, reader: Headers) -> None:
    assert {client.get("/v1/jobs", headers=reader).status_code for _ in range(30)} == {200}


def test_a_tokens_jobs_in_flight_are_capped(limited: Callable[..., TestClient], auth: Callable[..., Headers]) -> None:
    c = limited(max_active_jobs_per_token=2, retry_after_seconds=7)
    mine, theirs = auth(Scope.PLANS_WRITE), auth(Scope.PLANS_WRITE)
    answers = [c.post("/v1/plans", json=_request(g), headers=mine) for g in (1, 2)]
    assert [a.status_code for a in answers] == [202, 202]
    r = c.post("/v1/plans", json=_request(4), headers=mine)
    assert _retry_after(r, 429) == 7 and "PARPLAN_MAX_ACTIVE_JOBS_PER_TOKEN" in r.json()["detail"]
    # The same request as one in flight joins it: no new job, so no refusal.
    assert c.post("/v1/plans", json=_request(1), headers=mine).status_code == 202
    assert c.post("/v1/plans", json=_request(4), headers=theirs).status_code == 202
    # A finished (here: cancelled) job no longer counts.
    assert c.post(f"/v1/jobs/{answers[0].json()['job']['id']}/cancel", headers=mine).status_code == 200
    assert c.post("/v1/plans", json=_request(8), headers=mine).status_code == 202


def test_a_full_queue_is_503(limited: Callable[..., TestClient], auth: Callable[..., Headers]) -> None:
    c = limited(max_queued_jobs=2, retry_after_seconds=3)
    one, two = auth(Scope.PLANS_WRITE), auth(Scope.PLANS_WRITE)
    assert c.post("/v1/plans", json=_request(1), headers=one).status_code == 202
    assert c.post("/v1/plans", json=_request(2), headers=two).status_code == 202
    r = c.post("/v1/plans", json=_request(4), headers=two)
    assert _retry_after(r, 503) == 3 and "PARPLAN_MAX_QUEUED_JOBS" in r.json()["detail"]
    assert c.post("/v1/plans", json=_request(2), headers=one).status_code == 202  # joins a queued job


def test_the_time_limit_is_capped(limited: Callable[..., TestClient], writer: Headers,
                                  db: sessionmaker[Session]) -> None:
    c = limited(max_time_limit_seconds=10)
    schema = c.get("/openapi.json").json()["components"]["schemas"]["PlanRequestIn"]["properties"]["time_limit"]
    assert [b["maximum"] for b in schema["anyOf"] if b.get("type") == "number"] == [10]
    r = c.post("/v1/plans", json={**_request(1), "time_limit": 11}, headers=writer)
    assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == "#/time_limit"
    r = c.post("/v1/plans", json={**_request(1), "time_limit": 10}, headers=writer)
    assert r.status_code == 202
    # A request without one gets min(60, the cap).
    r = c.post("/v1/plans", json=_request(2), headers=writer)
    assert r.status_code == 202
    with db() as s:
        job = s.get(Job, uuid.UUID(r.json()["job"]["id"]))
        assert job is not None and job.request["time_limit"] == 10


def test_concurrent_submissions_of_one_token_respect_its_cap(settings: Settings, committed_db: sessionmaker[Session],
                                                             queue: CeleryJobQueue) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from tests.support.service import make_token

    rt = Runtime(settings=settings.model_copy(update={"max_active_jobs_per_token": 1}), session_factory=committed_db,
                 queue=queue, run_sweeper=False)
    headers = {"Authorization": f"Bearer {make_token(committed_db, Scope.PLANS_WRITE)}"}
    with TestClient(create_app(runtime=rt), raise_server_exceptions=False) as c, ThreadPoolExecutor(6) as pool:
        codes = list(pool.map(lambda g: c.post("/v1/plans", json=_request(g), headers=headers).status_code,
                              (1, 2, 4, 8, 16, 32)))
    assert sorted(codes) == [202, 429, 429, 429, 429, 429], codes

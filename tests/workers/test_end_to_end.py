"""End to end over HTTP: `parplan serve` and a real Celery worker (`parplan worker`) as processes,
PostgreSQL and Redis for real. Submit, poll to succeeded, fetch the plan; the second identical
submission is served from the cache."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from parplan.service.models import Job, Plan
from tests.support.service import (
    FAST_REQUEST,
    SLOW_REQUEST,
    Proc,
    finished,
    poll_job,
    service_env,
    settings_env,
    start_server,
    start_worker,
)

SF = sessionmaker[Session]


@pytest.fixture
def stack(pg_url: str, redis_url: str, queue_name: str, committed_db: SF) -> Iterator[tuple[str, dict[str, str]]]:
    env = service_env(settings_env(pg_url, redis_url, queue_name))
    procs: list[Proc] = []
    try:
        server, base = start_server(env)
        procs.append(server)
        worker = start_worker(env)
        procs.append(worker)
        yield base, env | {"WORKER_NODE": worker.node_name or ""}
    finally:
        for p in procs:
            p.stop()


def _token(env: dict[str, str], scope: str) -> str:
    """Made with the real CLI against the test database."""
    out = subprocess.run([sys.executable, "-m", "parplan.cli", "token", "create", "--scope", scope],
                         env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_submit_poll_fetch_and_cache(stack: tuple[str, dict[str, str]], committed_db: SF) -> None:
    base, env = stack
    headers = {"Authorization": f"Bearer {_token(env, 'plans:write')}"}
    with httpx.Client(base_url=base, headers=headers, timeout=10) as c:
        r = c.post("/v1/plans", json=FAST_REQUEST)
        assert r.status_code == 202, r.text
        job = poll_job(c, r.headers["location"], finished)
        assert job["status"] == "succeeded", job
        assert job["progress"] == {"stage": "done", "fraction": 1.0} and job["started_at"] and job["finished_at"]
        plan = c.get(f"/v1/plans/{job['plan_id']}").json()
        assert plan["id"] == job["plan_id"] and plan["memory"]["peak_bytes"] > 0
        assert {"strategy", "time", "baselines", "solver"} <= set(plan)

        again = c.post("/v1/plans", json=FAST_REQUEST)
        assert again.status_code == 200 and again.json()["cached"] is True
        assert again.json()["plan"] == plan and again.json()["job"]["id"] == job["id"]
        metrics = c.get("/metrics").text
        assert 'parplan_jobs{status="succeeded"} 1.0' in metrics and "parplan_solve_seconds_count 1.0" in metrics
    with committed_db() as s:
        assert s.scalar(select(func.count()).select_from(Job)) == 1
        assert s.scalar(select(func.count()).select_from(Plan)) == 1


def test_the_worker_answers_its_health_check(stack: tuple[str, dict[str, str]]) -> None:
    _, env = stack
    ping = subprocess.run([sys.executable, "-m", "parplan.cli", "worker", "--ping", "--hostname", env["WORKER_NODE"]],
                          env=env, capture_output=True, text=True, timeout=30)
    assert ping.returncode == 0, ping.stdout + ping.stderr
    nobody = subprocess.run([sys.executable, "-m", "parplan.cli", "worker", "--ping", "--hostname", "nobody@nowhere"],
                            env=env, capture_output=True, text=True, timeout=30)
    assert nobody.returncode == 1


def test_cancel_reaches_a_running_solve_on_the_worker(stack: tuple[str, dict[str, str]]) -> None:
    base, env = stack
    headers = {"Authorization": f"Bearer {_token(env, 'plans:write')}"}
    with httpx.Client(base_url=base, headers=headers, timeout=10) as c:
        url = c.post("/v1/plans", json=SLOW_REQUEST).headers["location"]
        poll_job(c, url, lambda j: j["status"] != "queued")
        r = c.post(url + "/cancel")
        assert r.status_code in (200, 202, 409), r.text
        job = poll_job(c, url, finished, timeout=20)
        assert job["status"] in ("cancelled", "succeeded")  # succeeded only if it beat the cancel
        # The worker is free again: the next job runs.
        nxt = poll_job(c, c.post("/v1/plans", json=FAST_REQUEST).headers["location"], finished)
        assert nxt["status"] == "succeeded"

"""The embedded default: `parplan serve` with no configuration — a SQLite file, the in-process
executor, loopback, no tokens — solves plans end to end and survives a restart."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.support.service import (
    FAST_REQUEST,
    SLOW_REQUEST,
    Proc,
    finished,
    poll_job,
    service_env,
    start_server,
)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return service_env({"PARPLAN_DATA_DIR": str(tmp_path), "PARPLAN_SWEEP_INTERVAL_SECONDS": "0.3",
                        "PARPLAN_JOB_LEASE_SECONDS": "2"})


def test_plans_without_any_server_or_token(env: dict[str, str], procs: list[Proc], tmp_path: Path) -> None:
    server, base = start_server(env)
    procs.append(server)
    out = server.output()
    assert "authentication is OFF" in out and "loopback" in out and "in-process executor" in out
    assert (tmp_path / "parplan.db").exists()
    with httpx.Client(base_url=base, timeout=10) as c:
        assert c.get("/readyz").json()["checks"] == {"database": "ok", "broker": "ok", "queue": "in-process"}
        r = c.post("/v1/plans", json=FAST_REQUEST)
        assert r.status_code == 202, r.text
        job = poll_job(c, r.headers["location"], finished)
        assert job["status"] == "succeeded", job
        cached = c.post("/v1/plans", json=FAST_REQUEST)
        assert cached.status_code == 200 and cached.json()["plan"]["id"] == job["plan_id"]
        # A running solve is cancelled by terminating its process.
        url = c.post("/v1/plans", json=SLOW_REQUEST).headers["location"]
        poll_job(c, url, lambda j: j["status"] == "running")
        assert c.post(url + "/cancel").status_code in (200, 202)
        assert poll_job(c, url, finished, timeout=20)["status"] == "cancelled"


def test_jobs_survive_a_restart(env: dict[str, str], procs: list[Proc]) -> None:
    env = env | {"PARPLAN_EXECUTOR_WORKERS": "1"}
    server, base = start_server(env)
    with httpx.Client(base_url=base, timeout=10) as c:
        slow = c.post("/v1/plans", json=SLOW_REQUEST).headers["location"]
        fast = c.post("/v1/plans", json=FAST_REQUEST).headers["location"]
        poll_job(c, slow, lambda j: j["status"] == "running")
        assert c.get(fast).json()["job"]["status"] == "queued"
    server.stop()  # SIGTERM: the running solve is released back to the queue, not failed
    server, base = start_server(env)
    procs.append(server)
    with httpx.Client(base_url=base, timeout=10) as c:
        job = c.get(slow).json()["job"]
        assert job["status"] in ("queued", "running") and job["error"] is None, job
        c.post(slow + "/cancel")  # make room for the other one on the single solver slot
        assert poll_job(c, slow, finished, timeout=30)["status"] == "cancelled"
        done = poll_job(c, fast, finished, timeout=60)
        assert done["status"] == "succeeded", done


def test_off_loopback_tokens_are_required(env: dict[str, str], procs: list[Proc]) -> None:
    server, base = start_server(env, host="0.0.0.0")
    procs.append(server)
    assert "bearer tokens required" in server.output()
    with httpx.Client(base_url=base, timeout=10) as c:
        assert c.post("/v1/plans", json=FAST_REQUEST).status_code == 401
        assert c.get("/healthz").status_code == 200
    time.sleep(0)

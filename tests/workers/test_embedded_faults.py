"""Faults of the embedded default (`parplan serve` on a private SQLite file): SIGTERM lets the
requests in flight finish and hands the running job back, which completes after a restart; after a
SIGKILL with a job running, a restart completes that job too."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import httpx
import pytest

from tests.support.service import (
    MEDIUM_REQUEST,
    SLOW_REQUEST,
    Proc,
    finished,
    poll_job,
    service_env,
    start_server,
)

HW = {"key": "cpu-x86", "device": "cpu", "device_name": "cpu", "device_count": 1, "memory_bytes": 2**30,
      "torch_version": "2.13.0"}


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return service_env({"PARPLAN_DATA_DIR": str(tmp_path), "PARPLAN_SWEEP_INTERVAL_SECONDS": "0.3",
                        "PARPLAN_JOB_LEASE_SECONDS": "2", "PARPLAN_EXECUTOR_WORKERS": "1"})


def test_sigterm_drains_requests_and_hands_the_running_job_back(env: dict[str, str], procs: list[Proc]) -> None:
    server, base = start_server(env)
    procs.append(server)
    with httpx.Client(base_url=base, timeout=30) as c:
        # A solve of several seconds: still running when the short drain ends.
        job_url = c.post("/v1/plans", json=SLOW_REQUEST).headers["location"]
        poll_job(c, job_url, lambda j: j["status"] == "running")
        agent_id = c.post("/v1/agents/register", json={"name": "a", "hardware": HW}).json()["agent"]["id"]
    answers: list[int | str] = []

    def long_poll() -> None:  # a request in flight when the signal comes
        try:
            with httpx.Client(base_url=base, timeout=30) as c:
                answers.append(c.post("/v1/validations/claim",
                                      json={"agent_id": agent_id, "wait_seconds": 1.0}).status_code)
        except httpx.HTTPError as e:
            answers.append(repr(e))

    poller = threading.Thread(target=long_poll)
    poller.start()
    threading.Event().wait(0.2)
    server.kill(signal.SIGTERM)  # the whole process group, as a service manager stops it
    poller.join(timeout=30)
    assert answers == [204], answers
    assert "Shutting down" in server.output() or "Finished server process" in server.output()

    server, base = start_server(env)
    procs.append(server)
    with httpx.Client(base_url=base, timeout=30) as c:
        job = c.get(job_url).json()["job"]
        # Handed back to the queue at shutdown (not failed), and taken up again by the new process.
        assert job["status"] in ("queued", "running") and job["error"] is None, job
        done = poll_job(c, job_url, finished, timeout=180)
        assert done["status"] == "succeeded" and done["plan_id"], done
        assert done["attempts"] == 1, done  # a released attempt does not count


def test_sigkill_with_a_job_running_then_a_restart_completes_it(env: dict[str, str], procs: list[Proc]) -> None:
    server, base = start_server(env)
    with httpx.Client(base_url=base, timeout=30) as c:
        job_url = c.post("/v1/plans", json=MEDIUM_REQUEST).headers["location"]
        poll_job(c, job_url, lambda j: j["status"] == "running")
    server.kill(signal.SIGKILL)  # no shutdown at all: the job row still says running
    assert not server.alive()

    server, base = start_server(env)
    procs.append(server)
    with httpx.Client(base_url=base, timeout=30) as c:
        assert c.get(job_url).json()["job"]["status"] in ("running", "queued")
        done = poll_job(c, job_url, finished, timeout=120)
        assert done["status"] == "succeeded" and done["plan_id"] and done["error"] is None, done
        assert done["attempts"] == 2, done  # the killed attempt counts; the sweeper re-queued it

"""The validation agent's real client (parplan.agent.client) against the real service: register,
post a calibration, claim a validation, post the result; the next plan uses the calibration."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.service import FAST_REQUEST, Proc, finished, poll_job, service_env, start_server

client_mod = pytest.importorskip("parplan.agent.client")

HARDWARE = {"key": "A100-80GB", "device": "cuda", "device_name": "NVIDIA A100-SXM4-80GB", "device_count": 8,
            "memory_bytes": 80 * 2**30, "torch_version": "2.13.0"}
CALIBRATION = {"matmul_efficiency": {"bf16": 0.5}, "memory_efficiency": 0.75, "source": "agent:A100-80GB@interop"}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    env = service_env({"PARPLAN_DATA_DIR": str(tmp_path), "PARPLAN_AUTH": "required"})
    proc: Proc | None = None
    try:
        proc, base = start_server(env)
        yield base, env
    finally:
        if proc is not None:
            proc.stop()


def _token(env: dict[str, str], scope: str) -> str:
    return subprocess.run([sys.executable, "-m", "parplan.cli", "token", "create", "--scope", scope], env=env,
                          capture_output=True, text=True, check=True).stdout.strip()


def test_agent_client_round_trip(server: tuple[str, dict[str, str]]) -> None:
    base, env = server
    writer = {"Authorization": f"Bearer {_token(env, 'plans:write')}"}
    with httpx.Client(base_url=base, headers=writer, timeout=10) as c:
        job = poll_job(c, c.post("/v1/plans", json=FAST_REQUEST).headers["location"], finished)
        assert job["status"] == "succeeded"
        vid = c.post(f"/v1/plans/{job['plan_id']}/validations", json={"shrink": {"layers": 2, "hidden": None}}
                     ).json()["validation"]["id"]

    seen: list[dict[str, Any]] = []

    def run(validation: dict[str, Any]) -> dict[str, Any]:
        seen.append(validation)
        return {"hardware_key": HARDWARE["key"], "max_relative_error": 0.1, "ranks": [
            {"rank": 0, "measured": {"peak_bytes": 100, "breakdown": {"parameters": 40, "activations": 60}},
             "predicted": {"peak_bytes": 110, "breakdown": {"parameters": 40, "activations": 70}}}]}

    service = client_mod.ServiceClient(base, _token(env, "agent"), retries=2, backoff_s=0.1)
    try:
        agent = client_mod.Agent(service, "interop", HARDWARE, run, profiler=lambda: {"calibration": CALIBRATION},
                                 wait_seconds=1, heartbeat_s=0.5, max_validations=1)
        assert agent.run() == 1
    finally:
        service.close()
    assert seen[0]["id"] == vid and seen[0]["plan"]["id"] == job["plan_id"] and seen[0]["request"] == FAST_REQUEST
    assert seen[0]["shrink"] == {"layers": 2, "hidden": None}

    with httpx.Client(base_url=base, headers=writer, timeout=10) as c:
        v = c.get(f"/v1/validations/{vid}").json()["validation"]
        assert v["status"] == "succeeded" and v["result"]["categories"]["activations"][0]["predicted"] == 70
        profiles = c.get("/v1/profiles", params={"hardware_key": "A100-80GB"}).json()["profiles"]
        kinds = sorted(p["kind"] for p in profiles)
        assert kinds == ["microbenchmark", "validation"]
        # FAST_REQUEST runs on the default GPU, A100-80GB: the agent's calibration now applies.
        again = c.post("/v1/plans", json=FAST_REQUEST)
        assert again.status_code == 202, again.text  # a new calibration means a new plan
        solved = poll_job(c, again.headers["location"], finished)
        plan = c.get(f"/v1/plans/{solved['plan_id']}").json()
        assert plan["time"]["calibration"] == "agent:A100-80GB@interop"

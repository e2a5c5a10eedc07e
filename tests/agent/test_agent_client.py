"""The agent's HTTP client and loop against an in-test fake of the service (tests/agent/agent_fake_service.py)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_fake_service import FakeService

from parplan.agent.client import Agent, ProtocolError, ServiceClient
from parplan.agent.validate import hardware

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def service() -> Iterator[FakeService]:
    svc = FakeService().start()
    yield svc
    svc.stop()


def _client(svc: FakeService, **kw: Any) -> ServiceClient:
    return ServiceClient(svc.url, svc.token, backoff_s=0.01, **kw)


def _measurement() -> dict[str, Any]:
    return {"hardware_key": "cpu:test", "ranks": [], "max_relative_error": 0.0,
            "step_seconds": {"measured": 1.0, "predicted": 0.5}, "config": {}}


def test_agent_registers_heartbeats_profiles_and_posts_results(service: FakeService) -> None:
    service.enqueue({"id": "v1", "plan_id": "p1", "plan": {}, "request": {}, "shrink": None})
    seen: list[str] = []

    def run(v: dict[str, Any]) -> dict[str, Any]:
        seen.append(v["id"])
        time.sleep(0.3)  # long enough for a few heartbeats
        return _measurement()

    agent = Agent(_client(service), "test-agent", hardware("cpu"), run, lambda: {"matmul_flops_per_s": {"fp32": 1.0}},
                  wait_seconds=1, heartbeat_s=0.05, max_validations=1)
    assert agent.run() == 1
    assert seen == ["v1"]
    assert service.results["v1"]["status"] == "succeeded"
    assert service.results["v1"]["agent_id"] == agent.agent_id
    assert service.results["v1"]["measurement"]["step_seconds"]["measured"] == 1.0
    assert len(service.heartbeats) >= 2
    assert service.profiles[0]["hardware_key"] == hardware("cpu")["key"]
    assert service.profiles[0]["kind"] == "microbenchmark"


def test_a_failing_run_is_posted_as_failed(service: FakeService) -> None:
    service.enqueue({"id": "v2", "plan_id": "p", "plan": {}, "request": {}, "shrink": None})

    def run(v: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("out of memory on rank 3")

    agent = Agent(_client(service), "a", hardware("cpu"), run, wait_seconds=0, max_validations=1)
    agent.run()
    body = service.results["v2"]
    assert body["status"] == "failed"
    assert "out of memory on rank 3" in body["error"]
    assert body["measurement"] is None


def test_empty_queue_long_polls_and_stop_ends_the_loop(service: FakeService) -> None:
    agent = Agent(_client(service), "a", hardware("cpu"), lambda v: _measurement(), wait_seconds=1)
    t = threading.Thread(target=agent.run)
    t.start()
    time.sleep(1.5)
    agent.stop()
    t.join(timeout=5)
    assert not t.is_alive()
    assert service.claims and all(c["wait_seconds"] == 1 for c in service.claims)
    assert not service.results


def test_5xx_answers_are_retried_with_backoff(service: FakeService) -> None:
    service.fail_next = 2
    agent_id = _client(service).register("a", hardware("cpu"))
    assert agent_id in service.agents
    assert [s for _, _, s in service.requests] == [503, 503, 201]


def test_connection_errors_are_retried_until_the_service_is_up() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    svc = FakeService(port=port)
    starter = threading.Timer(0.5, svc.start)
    starter.start()
    try:
        client = ServiceClient(f"http://127.0.0.1:{port}", svc.token, backoff_s=0.1, retries=8)
        assert client.register("a", hardware("cpu")) in svc.agents
    finally:
        starter.join()
        svc.stop()


def test_4xx_is_not_retried(service: FakeService) -> None:
    client = ServiceClient(service.url, "wrong-token", backoff_s=0.01)
    with pytest.raises(ProtocolError, match="401"):
        client.register("a", hardware("cpu"))
    assert len(service.requests) == 1


def test_retries_give_up(service: FakeService) -> None:
    service.fail_next = 10
    with pytest.raises(ProtocolError, match="giving up"):
        _client(service, retries=2).register("a", hardware("cpu"))


def _agent_cli(svc: FakeService, *extra: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "parplan.cli", "agent", "--server", svc.url, "--token", svc.token,
                             "--name", "cli-agent", "--device", "cpu", "--wait-seconds", "1", "--no-profile", *extra],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_sigterm_shuts_the_agent_down_cleanly(service: FakeService) -> None:
    proc = _agent_cli(service)
    deadline = time.monotonic() + 60
    while not service.claims and time.monotonic() < deadline:
        time.sleep(0.1)
    assert service.claims, "the agent never claimed"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "finishing the current validation" in out
    assert "stopped after 0 validation(s)" in out


@pytest.mark.slow
def test_agent_runs_a_real_validation_of_a_shrunk_preset(service: FakeService) -> None:
    """End to end on this machine: a GPT-1.7B plan (TP 2) validated on a shrunk copy."""
    plan = {"strategy": {"tp": 2, "pp": 1, "dp": 1, "zero": 0, "sequence_parallel": False, "recompute": "none",
                         "micro_batch": 1, "num_microbatches": 1, "global_batch": 1, "schedule": "1f1b",
                         "virtual_stages": 1, "flash_attention": True, "precision": "bf16"},
            "model": {"name": "gpt-1.7b", "parameters": 1_700_000_000, "seq_len": 64}}
    request = {"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": 2, "gpus_per_node": 8, "gpu": "A100-80GB"},
               "training": {"global_batch": 1, "seq_len": 64}}
    service.enqueue({"id": "v-real", "plan_id": "p-real", "plan": plan, "request": request,
                     "shrink": {"layers": 2, "hidden": 128}})
    proc = _agent_cli(service)
    deadline = time.monotonic() + 60
    while not service.claims and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)  # mid-run: the validation is finished and posted, then the agent exits
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert "stopped after 1 validation(s)" in out
    body = service.results["v-real"]
    assert body["status"] == "succeeded", body.get("error")
    meas = body["measurement"]
    assert meas["hardware_key"] == service.agents[body["agent_id"]]["hardware"]["key"]
    assert [r["rank"] for r in meas["ranks"]] == [0, 1]
    for r in meas["ranks"]:
        assert r["measured"]["peak_bytes"] > 0
        assert set(r["measured"]["breakdown"]) >= {"parameters", "gradients", "optimizer_states", "activations",
                                                   "temporary"}
        assert r["predicted"]["peak_bytes"] > 0
        assert r["check"]["ok"]
    cfg = meas["config"]
    assert cfg["model"]["layers"] == 2 and cfg["model"]["hidden"] == 128 and cfg["tp"] == 2
    assert cfg["shrunk_from"] == "gpt-1.7b"
    assert meas["step_seconds"]["measured"] > 0 and meas["step_seconds"]["predicted"] > 0
    assert 0 <= meas["max_relative_error"] < 1
    json.dumps(body)


@pytest.mark.slow
def test_microbenchmark_profile_is_a_valid_calibration() -> None:
    import torch

    from parplan.agent.microbench import profile
    from parplan.solver.calibration import Calibration

    data = profile(hardware("cpu"), torch.device("cpu"), max_procs=2, nbytes=2**20, repeats=2)
    assert data["matmul_flops_per_s"]["fp32"] > 0
    assert set(data["all_reduce_bytes_per_s"]) == {"2"} and data["all_reduce_bytes_per_s"]["2"] > 0
    assert data["all_gather_bytes_per_s"]["2"] > 0
    calib = Calibration.from_dict(data["calibration"])
    assert calib.intra_node is not None and calib.intra_node.bandwidth_bytes_per_s > 0
    assert calib.source.startswith("agent:cpu")

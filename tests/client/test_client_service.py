"""The client and `parplan remote plan` against a real `parplan serve` (SQLite, in-process
executor, tokens required): submit, follow, fetch, export, cancel, the service's problems
as typed errors, and a server killed while the client waits."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from parplan.client import (
    AsyncClient,
    Client,
    ForbiddenError,
    InvalidRequestError,
    JobCancelledError,
    UnauthorizedError,
    UnreachableError,
)
from tests.support.service import FAST_REQUEST, SLOW_REQUEST, service_env, start_server

Service = tuple[str, str, dict[str, str]]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    env = service_env({"PARPLAN_DATA_DIR": str(tmp_path_factory.mktemp("client")), "PARPLAN_AUTH": "required",
                       "PARPLAN_EXECUTOR_WORKERS": "2"})
    server, base = start_server(env)
    try:
        token = subprocess.run([sys.executable, "-m", "parplan.cli", "token", "create", "--scope", "plans:write"],
                               env=env, capture_output=True, text=True, check=True).stdout.strip()
        yield base, token, env
    finally:
        server.stop()


def test_plan_and_wait_then_export(service: Service) -> None:
    base, token, _ = service
    request = FAST_REQUEST | {"target": "deepspeed", "search": "auto"}
    seen: list[dict[str, Any]] = []
    with Client(base, token, timeout=10) as c:
        plan = c.plan_and_wait(request, timeout=60, on_progress=seen.append)
        assert plan["memory"]["peak_bytes"] > 0 and plan["target"]["name"] == "deepspeed"
        assert seen and seen[-1]["status"] == "succeeded" and seen[-1]["plan_id"] == plan["id"]
        exported = c.export(plan["id"], "deepspeed")
        assert "ds_config.json" in exported["files"] and exported["launch"]
        again = c.submit(request)  # the cache answers the same request with the plan itself
        assert again["cached"] is True and again["plan"]["id"] == plan["id"]
        assert c.plan_and_wait(request) == again["plan"]


def test_the_services_problems_are_typed_errors(service: Service) -> None:
    base, token, env = service
    with Client(base, token, timeout=10) as c:
        with pytest.raises(InvalidRequestError) as e:
            c.submit({"model": {"preset": "bert-large"}, "cluster": {"gpus": 0}})
        assert e.value.status == 422 and e.value.errors[0]["field"] == "cluster.gpus"
    with Client(base, None, timeout=10) as anonymous, pytest.raises(UnauthorizedError):
        anonymous.submit(FAST_REQUEST)
    with Client(base, "ppt_" + "0" * 43, timeout=10) as unknown, pytest.raises(UnauthorizedError) as u:
        unknown.job("00000000-0000-0000-0000-000000000000")
    assert u.value.status == 401
    reader = subprocess.run([sys.executable, "-m", "parplan.cli", "token", "create", "--scope", "plans:read"],
                            env=env, capture_output=True, text=True, check=True).stdout.strip()
    with Client(base, reader, timeout=10) as c, pytest.raises(ForbiddenError) as f:
        c.submit(FAST_REQUEST)  # plans:read may not submit
    assert f.value.status == 403 and f.value.problem["status"] == 403


def test_the_async_client_waits_and_a_cancelled_job_raises(service: Service) -> None:
    base, token, _ = service

    async def run() -> None:
        async with AsyncClient(base, token, timeout=10) as c:
            plan = await c.plan_and_wait({"model": {"preset": "bert-large"}, "cluster": {"gpus": 4},
                                          "search": "dp"}, timeout=60)
            assert plan["cluster"]["gpus"] == 4
            job = (await c.submit(SLOW_REQUEST))["job"]
            waiting = asyncio.create_task(c.wait(job["id"], timeout=60))
            while (await c.job(job["id"]))["status"] != "running":
                await asyncio.sleep(0.1)
            await c.cancel(job["id"])
            with pytest.raises(JobCancelledError):
                await waiting
    asyncio.run(run())


@pytest.mark.parametrize("use_events", [True, False], ids=["events", "long-poll"])
def test_a_server_killed_mid_wait_is_retried_then_unreachable(tmp_path: Path, use_events: bool) -> None:
    env = service_env({"PARPLAN_DATA_DIR": str(tmp_path), "PARPLAN_AUTH": "required",
                       "PARPLAN_EXECUTOR_WORKERS": "1"})
    server, base = start_server(env)
    try:
        token = subprocess.run([sys.executable, "-m", "parplan.cli", "token", "create", "--scope", "plans:write"],
                               env=env, capture_output=True, text=True, check=True).stdout.strip()
        sent: list[tuple[float, httpx.Request]] = []
        http = httpx.Client(base_url=base, event_hooks={"request": [lambda r: sent.append((time.monotonic(), r))]})
        slept: list[float] = []  # when the client paused before another try

        def sleep(seconds: float) -> None:
            slept.append(time.monotonic())
            time.sleep(seconds)
        retries, outcome = 2, dict[str, Any]()
        with Client(base, token, timeout=5, retries=retries, backoff=0.2, http=http, sleep=sleep) as c:
            job = c.submit(SLOW_REQUEST)["job"]  # gpt3-175b on 1,024 GPUs: solves for longer than this test

            def wait() -> None:
                try:
                    c.wait(job["id"], timeout=120, use_events=use_events)
                except Exception as e:
                    outcome["error"], outcome["at"] = e, time.monotonic()
            waiter = threading.Thread(target=wait, daemon=True)
            waiter.start()
            while c.job(job["id"])["status"] != "running" or not any("/events" in str(r.url) or "wait=" in str(r.url)
                                                                      for _, r in sent):
                time.sleep(0.1)
            time.sleep(1.5)  # the wait is reading its stream (or long poll) now
            killed = time.monotonic()
            server.kill()  # SIGKILL to the server's process group, solver included
            waiter.join(timeout=60)
            assert not waiter.is_alive(), "the wait hung after the server died"
        http.close()
    finally:
        server.stop()
    error = outcome.get("error")
    assert isinstance(error, UnreachableError), repr(error)
    after = [r for t, r in sent if t > killed]
    pauses = [t for t in slept if t > killed]
    if use_events:  # the stream breaks; reconnects with Last-Event-ID, each refused, then the error
        assert len(pauses) == retries + 1 and len(after) == retries + 1, (pauses, after)
        assert all(r.url.path.endswith("/events") and r.headers["last-event-id"].isdigit() for r in after)
        assert f"events of job {job['id']}" in str(error) and "ConnectError" in str(error)
    else:  # the long poll cut by the kill (or one sent just after it), then its retries
        assert len(pauses) == retries and len(after) in (retries, retries + 1), (pauses, after)
        assert all(r.url.params.get("wait") for r in after) and f"/v1/jobs/{job['id']}" in str(error)
    assert outcome["at"] - killed < 15, outcome["at"] - killed


def _remote(env: dict[str, str], *args: str, token: str | None = None, url: str | None = None) -> Any:
    e = {k: v for k, v in env.items() if k not in ("PARPLAN_TOKEN", "PARPLAN_URL")}
    if token:
        e["PARPLAN_TOKEN"] = token
    if url:
        e["PARPLAN_URL"] = url
    return subprocess.run([sys.executable, "-m", "parplan.cli", "remote", "plan", *args], env=e,
                          capture_output=True, text=True, timeout=120)


def test_remote_plan_prints_what_plan_prints(service: Service, tmp_path: Path) -> None:
    base, token, env = service
    flags = ["--model", "bert-large", "--gpus", "2", "--search", "dp"]
    out = _remote(env, *flags, "--json", token=token, url=base)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert {"memory", "time", "strategy", "baselines", "solver"} <= set(doc)
    assert doc["memory"]["breakdown"].keys() >= {"parameters", "gradients", "optimizer_states", "activations"}
    with Client(base, token) as c:
        assert c.plan(doc["id"]) == doc
    local = subprocess.run([sys.executable, "-m", "parplan.cli", "plan", *flags, "--json"], capture_output=True,
                           text=True, timeout=120)
    assert json.loads(local.stdout)["strategy"] == doc["strategy"]

    table = _remote(env, *flags[:4], "--url", base, "--target", "deepspeed", "--export", str(tmp_path / "ds"),
                    token=token)
    assert table.returncode == 0, table.stderr
    assert table.stdout.startswith("model     bert-large") and "baselines" in table.stdout
    assert (tmp_path / "ds" / "ds_config.json").exists() and "wrote ds_config.json" in table.stderr


def test_remote_plan_errors_are_one_line(service: Service) -> None:
    base, token, env = service
    refused = _remote(env, "--model", "bert-large", "--gpus", "2", url=base)  # no PARPLAN_TOKEN
    assert refused.returncode == 2 and "401" in refused.stderr and "Traceback" not in refused.stderr
    bad = _remote(env, "--model", "bert-large", "--gpus", "2", "--gpu", "NO-SUCH-GPU", token=token, url=base)
    assert bad.returncode == 2 and "answered 422" in bad.stderr and "unknown GPU 'NO-SUCH-GPU'" in bad.stderr
    assert bad.stderr.count("\n") == 1 and bad.stdout == ""
    no_url = _remote(env, "--model", "bert-large", "--gpus", "2", token=token)
    assert no_url.returncode == 2 and "PARPLAN_URL" in no_url.stderr

"""The OpenAPI document is the contract: Schemathesis (``--checks all``) generates requests from it,
valid and invalid, against a real ``parplan serve`` with an admin token, and every answer must be
what the document says: documented statuses and content types, problem+json errors, no 5xx, valid
requests accepted and invalid ones refused. Bounded by ``--max-examples`` and ``--max-time``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from tests.support.service import (
    REDIS_URL,
    create_database,
    drop_database,
    postgres_available,
    redis_available,
    service_env,
    start_server,
    unreachable,
)

CONFIG = Path(__file__).with_name("schemathesis.toml")
#: Per run: examples per operation and phase, and the time budget of the fuzzing phases (seconds).
MAX_EXAMPLES = 8
MAX_TIME = 45


def _token(env: dict[str, str]) -> str:
    out = subprocess.run([sys.executable, "-m", "parplan.cli", "token", "create", "--scope", "admin", "--json"],
                         env=env, capture_output=True, text=True, timeout=60, check=True)
    token: str = json.loads(out.stdout)["token"]
    return token


def _limits(env: dict[str, str]) -> dict[str, str]:
    """Settings that keep a fuzzing run cheap and quick: one short solve at a time, short long polls."""
    return {**env, "PARPLAN_AUTH": "required", "PARPLAN_EXECUTOR_WORKERS": "1",
            "PARPLAN_JOB_TIMEOUT_SECONDS": "2", "PARPLAN_MAX_CLAIM_WAIT_SECONDS": "1",
            "PARPLAN_MAX_JOB_WAIT_SECONDS": "1", "PARPLAN_MAX_TIME_LIMIT_SECONDS": "5", "PARPLAN_MAX_DEVICES": "4096"}


@pytest.fixture(params=["embedded", "production"])
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A running service (base URL) of either layout and an admin token for it."""
    if request.param == "embedded":
        env = service_env(_limits({"PARPLAN_DATA_DIR": str(tmp_path / "data")}))
        db_name = None
    else:
        for what, why in (("PostgreSQL", postgres_available()), ("Redis", redis_available())):
            if why is not None:
                unreachable(what, why)
        db_name = f"parplan_contract_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        queue = f"parplan-contract-{uuid.uuid4().hex[:8]}"
        # No worker: jobs stay queued, which is all the contract needs (and costs no solving).
        env = service_env(_limits({"PARPLAN_DATABASE_URL": create_database(db_name),
                                   "PARPLAN_BROKER_URL": REDIS_URL, "PARPLAN_QUEUE_NAME": queue}))
    token = _token(env)
    proc, base = start_server(env)
    try:
        yield base, token
    finally:
        proc.stop()
        if db_name is not None:
            drop_database(db_name)
            client = redis.Redis.from_url(REDIS_URL)
            client.delete(queue)  # the messages of jobs no worker took
            client.close()


def test_the_service_keeps_its_openapi_contract(service: tuple[str, str], tmp_path: Path) -> None:
    base, token = service
    report = tmp_path / "report.json"
    started = time.monotonic()
    run = subprocess.run(
        [str(Path(sys.executable).with_name("schemathesis")), "--config-file", str(CONFIG), "run",
         f"{base}/openapi.json", "--checks", "all", "-H", f"Authorization: Bearer {token}",
         "--max-examples", str(MAX_EXAMPLES), "--max-time", str(MAX_TIME), "--seed", "15",
         "--request-timeout", "10", "--report", "json", "--report-json-path", str(report), "--no-color"],
        capture_output=True, text=True, timeout=240, env={**os.environ, "NO_COLOR": "1"}, cwd=tmp_path)
    elapsed = time.monotonic() - started
    summary = run.stdout[-6000:]
    cases = next((line.strip() for line in run.stdout.splitlines() if re.match(r"\s*\d+ generated", line)), "?")
    print(f"schemathesis on {base}: {cases} ({elapsed:.0f} s)")  # shown with pytest -s or -rP
    assert run.returncode == 0, f"schemathesis found problems ({elapsed:.0f} s):\n{summary}\n{run.stderr[-2000:]}"
    # The run really exercised the API: every operation, with many cases, and found nothing.
    tested = re.search(r"Tested: (\d+)", run.stdout)
    assert tested and int(tested.group(1)) >= 20, summary
    generated = re.match(r"(\d+) generated", cases)
    # (how many fit in MAX_TIME depends on the machine's load: 427 on the 2-core machine at load 6)
    assert generated and int(generated.group(1)) >= 300, summary
    assert "found" not in cases, summary
    assert httpx.get(base + "/healthz", timeout=5).status_code == 200

"""Security basics: token expiry, listing and revocation; agents post only for validations they
hold; no secret in the logs; security headers; CORS only when configured."""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from parplan.cli import main
from parplan.service.app import create_app
from parplan.service.auth.service import Scope, create_token
from parplan.service.database import utcnow
from parplan.service.redaction import redact
from parplan.service.runtime import Runtime
from parplan.service.settings import Settings
from parplan.service.token_commands import parse_expires
from parplan.workers.celery_app import CeleryJobQueue

Headers = dict[str, str]
PROBLEM = "application/problem+json"
HW = {"key": "A100-80GB", "device": "cuda", "device_name": "A100", "device_count": 8,
      "memory_bytes": 80 * 2**30, "torch_version": "2.13.0"}


def _token(db: sessionmaker[Session], expires_in: timedelta | None) -> Headers:
    with db() as s:
        _, secret = create_token(s, "t", frozenset({Scope.PLANS_READ}),
                                 utcnow() + expires_in if expires_in is not None else None)
        s.commit()
    return {"Authorization": f"Bearer {secret}"}


def test_an_expired_token_is_401(client: TestClient, db: sessionmaker[Session]) -> None:
    assert client.get("/v1/jobs", headers=_token(db, timedelta(hours=1))).status_code == 200
    r = client.get("/v1/jobs", headers=_token(db, timedelta(seconds=-1)))
    assert r.status_code == 401 and r.headers["content-type"] == PROBLEM


def test_parse_expires() -> None:
    now = utcnow()
    assert parse_expires("30d", now) == now + timedelta(days=30)
    assert parse_expires("90m", now) == now + timedelta(minutes=90)
    assert parse_expires("2999-01-01", now).year == 2999
    for bad in ("soon", "2000-01-01", "-3d"):
        with pytest.raises(ValueError, match="expires"):
            parse_expires(bad, now)


@pytest.fixture
def embedded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for k in list(os.environ):
        if k.startswith("PARPLAN_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("PARPLAN_DATA_DIR", str(tmp_path))
    return tmp_path


def test_token_create_list_revoke(embedded: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["token", "create", "--scope", "plans:read", "--name", "ci", "--expires", "1h", "--json"]) == 0
    made = json.loads(capsys.readouterr().out)
    assert made["expires_at"] is not None
    assert main(["token", "create", "--scope", "agent", "--name", "gpu", "--json"]) == 0
    other = json.loads(capsys.readouterr().out)
    assert main(["token", "list", "--json"]) == 0
    out = capsys.readouterr().out
    listed = {t["name"]: t for t in json.loads(out)["tokens"]}
    assert set(listed) == {"ci", "gpu"} and listed["ci"]["state"] == "active"
    assert made["token"] not in out and other["token"] not in out  # never the secret
    assert main(["token", "revoke", made["token"][:10]]) == 0  # by the prefix the list shows
    assert main(["token", "list", "--json"]) == 0
    assert [t["name"] for t in json.loads(capsys.readouterr().out)["tokens"]] == ["gpu"]
    assert main(["token", "list", "--all", "--json"]) == 0
    states = {t["name"]: t["state"] for t in json.loads(capsys.readouterr().out)["tokens"]}
    assert states == {"ci": "revoked", "gpu": "active"}
    assert main(["token", "revoke", other["id"]]) == 0
    assert main(["token", "revoke", "ppt_nothing"]) == 2
    assert main(["token", "create", "--scope", "agent", "--expires", "yesterday"]) == 2


def _register(client: TestClient, headers: Headers) -> str:
    r = client.post("/v1/agents/register", json={"name": "box", "hardware": HW}, headers=headers)
    assert r.status_code == 201, r.text
    agent_id: str = r.json()["agent"]["id"]
    return agent_id


def test_an_agent_posts_results_only_for_validations_it_claimed(client: TestClient, db: sessionmaker[Session],
                                                                auth: Callable[..., Headers],
                                                                writer: Headers) -> None:
    from parplan.service.models import Plan

    with db() as s:
        plan = Plan(cache_key=uuid.uuid4().hex, request_hash="h", solver_version="t", calibration_source="default",
                    request={}, document={"memory": {"peak_bytes": 1}})
        s.add(plan)
        s.commit()
        plan_id = plan.id
    mine, theirs = auth(Scope.AGENT), auth(Scope.AGENT)
    a, b = _register(client, mine), _register(client, theirs)
    vid = client.post(f"/v1/plans/{plan_id}/validations", headers=writer).json()["validation"]["id"]
    assert client.post("/v1/validations/claim", json={"agent_id": a}, headers=mine).json()["validation"]["id"] == vid
    result = {"status": "failed", "error": "made up"}
    r = client.post(f"/v1/validations/{vid}/result", json={"agent_id": b, **result}, headers=theirs)
    assert r.status_code == 409 and r.headers["content-type"] == PROBLEM and "not held by agent" in r.json()["detail"]
    r = client.post(f"/v1/validations/{vid}/result", json={"agent_id": a, **result}, headers=theirs)
    assert r.status_code == 403 and r.headers["content-type"] == PROBLEM
    r = client.post(f"/v1/validations/{vid}/result", json={"agent_id": a, **result}, headers=mine)
    assert r.status_code == 200 and r.json()["validation"]["status"] == "failed"


def test_no_secret_reaches_the_logs(client: TestClient, writer: Headers, caplog: pytest.LogCaptureFixture) -> None:
    secret = writer["Authorization"].removeprefix("Bearer ")
    caplog.set_level(logging.DEBUG)
    client.post("/v1/plans", json={"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": 8}}, headers=writer)
    client.get("/v1/jobs", headers=writer)
    client.get("/v1/jobs", headers={"Authorization": f"Bearer {secret}x"})  # an invalid token
    log = logging.getLogger("parplan.service")
    log.warning("connecting to %s with %s", "postgresql+psycopg://parplan:hunter2@db:5432/parplan", secret)
    log.error("request failed: Authorization: Bearer %s", "abc.def-ghi")
    try:
        raise RuntimeError(f"cannot reach redis://:s3cret@cache:6379/0 for {secret}")
    except RuntimeError:
        log.exception("broker error")
    text = caplog.text + "".join(r.getMessage() + (r.exc_text or "") for r in caplog.records)
    assert "broker error" in text and "postgresql+psycopg://parplan:[REDACTED]@db" in text
    for leaked in (secret, "hunter2", "s3cret", "abc.def-ghi"):
        assert leaked not in text


def test_redact() -> None:
    assert redact("url postgresql://u:p%40ss@h/db ok") == "url postgresql://u:[REDACTED]@h/db ok"
    assert redact("token ppt_abcdefghijklmnop end") == "token ppt_[REDACTED] end"
    assert redact("no secrets in postgresql://h/db") == "no secrets in postgresql://h/db"


def test_security_headers(client: TestClient, reader: Headers) -> None:
    for r in (client.get("/v1/jobs", headers=reader), client.get("/v1/jobs"), client.get("/healthz")):
        assert r.headers["x-content-type-options"] == "nosniff" and r.headers["referrer-policy"] == "no-referrer"
        assert "content-security-policy" not in r.headers
    docs = client.get("/docs")
    assert docs.headers["content-type"].startswith("text/html")
    assert "frame-ancestors 'none'" in docs.headers["content-security-policy"]
    assert docs.headers["x-frame-options"] == "DENY"


@pytest.fixture
def cors_client(settings: Settings, db: sessionmaker[Session], queue: CeleryJobQueue) -> Iterator[TestClient]:
    cors = settings.model_copy(update={"cors_origins": "https://dash.example"})
    rt = Runtime(settings=cors, session_factory=db, queue=queue, run_sweeper=False)
    with TestClient(create_app(runtime=rt)) as c:
        yield c


def test_cors_is_off_unless_configured(client: TestClient, cors_client: TestClient, reader: Headers) -> None:
    preflight = {"Origin": "https://dash.example", "Access-Control-Request-Method": "GET",
                 "Access-Control-Request-Headers": "authorization"}
    r = client.options("/v1/jobs", headers=preflight)
    assert "access-control-allow-origin" not in r.headers
    assert "access-control-allow-origin" not in client.get("/v1/jobs", headers={**reader, "Origin": "https://x"}).headers
    r = cors_client.options("/v1/jobs", headers=preflight)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://dash.example"
    r = cors_client.get("/v1/jobs", headers={**reader, "Origin": "https://dash.example"})
    assert r.headers["access-control-allow-origin"] == "https://dash.example"
    r = cors_client.options("/v1/jobs", headers={**preflight, "Origin": "https://evil.example"})
    assert r.headers.get("access-control-allow-origin") != "https://evil.example"


def test_a_job_records_the_token_that_submitted_it(client: TestClient, db: sessionmaker[Session],
                                                   auth: Callable[..., Headers]) -> None:
    from parplan.service.auth.service import hash_token
    from parplan.service.models import ApiToken, Job

    headers = auth(Scope.PLANS_WRITE)
    r = client.post("/v1/plans", json={"model": {"preset": "bert-large"}, "cluster": {"gpus": 2}}, headers=headers)
    assert r.status_code == 202, r.text
    with db() as s:
        token = s.query(ApiToken).filter(
            ApiToken.token_hash == hash_token(headers["Authorization"].removeprefix("Bearer "))).one()
        job = s.get(Job, uuid.UUID(r.json()["job"]["id"]))
        assert job is not None and job.token_id == token.id

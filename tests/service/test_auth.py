"""Bearer tokens with scopes: no token → 401, wrong scope → 403, agent tokens cannot touch plans."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from parplan.service.auth.service import Scope, hash_token, parse_scopes
from parplan.service.database import utcnow
from parplan.service.models import ApiToken

Headers = dict[str, str]
BODY = {"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": 8}}
JOB = "/v1/jobs/00000000-0000-0000-0000-000000000000"
PLAN = "/v1/plans/00000000-0000-0000-0000-000000000000"

PROTECTED = [("POST", "/v1/plans", BODY), ("GET", "/v1/jobs", None), ("GET", JOB, None),
             ("POST", JOB + "/cancel", None), ("GET", PLAN, None), ("GET", "/v1/models", None),
             ("GET", "/v1/clusters/presets", None), ("POST", PLAN + "/validations", {}),
             ("GET", "/v1/validations/00000000-0000-0000-0000-000000000000", None),
             ("POST", "/v1/validations/claim", {"agent_id": "00000000-0000-0000-0000-000000000000"}),
             ("POST", "/v1/agents/register", {"name": "a", "hardware": {}}), ("GET", "/v1/profiles", None),
             ("POST", "/v1/profiles", {"hardware_key": "x", "kind": "validation", "data": {}})]


@pytest.mark.parametrize(("method", "path", "body"), PROTECTED)
def test_no_token_is_401(client: TestClient, method: str, path: str, body: object) -> None:
    r = client.request(method, path, json=body)
    assert r.status_code == 401, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert r.headers["www-authenticate"].startswith("Bearer")


@pytest.mark.parametrize("header", ["Bearer ppt_nonsense", "Bearer ", "Basic dXNlcjpwYXNz", "ppt_abc"])
def test_invalid_tokens_are_401(client: TestClient, header: str) -> None:
    assert client.get("/v1/jobs", headers={"Authorization": header}).status_code == 401


def test_revoked_token_is_401(client: TestClient, db: sessionmaker[Session], auth: Callable[..., Headers],
                              runtime: object) -> None:
    headers = auth(Scope.PLANS_READ)
    secret = headers["Authorization"].removeprefix("Bearer ")
    with db() as s:
        s.execute(update(ApiToken).where(ApiToken.token_hash == hash_token(secret)).values(revoked_at=utcnow()))
        s.commit()
    getattr(runtime, "verifier")._cache.clear()  # noqa: B009 - the cache would otherwise keep it for 5 s
    assert client.get("/v1/jobs", headers=headers).status_code == 401


def test_tokens_are_stored_hashed(db: sessionmaker[Session], auth: Callable[..., Headers]) -> None:
    secret = auth(Scope.ADMIN)["Authorization"].removeprefix("Bearer ")
    with db() as s:
        row = s.query(ApiToken).filter(ApiToken.token_hash == hash_token(secret)).one()
        assert secret not in (row.token_hash, row.prefix, row.name) and row.scopes == ["admin"]


def test_wrong_scope_is_403(client: TestClient, reader: Headers, writer: Headers) -> None:
    r = client.post("/v1/plans", json=BODY, headers=reader)
    assert r.status_code == 403 and "plans:write" in r.json()["detail"]
    assert client.post("/v1/agents/register", json={"name": "a", "hardware": {}}, headers=writer).status_code == 403
    assert client.post("/v1/profiles", json={"hardware_key": "x", "kind": "validation", "data": {}},
                       headers=reader).status_code == 403


def test_an_agent_token_cannot_read_or_submit_plans(client: TestClient, agent: Headers) -> None:
    for method, path, body in [("POST", "/v1/plans", BODY), ("GET", "/v1/jobs", None), ("GET", JOB, None),
                               ("GET", PLAN, None), ("POST", JOB + "/cancel", None), ("GET", "/v1/profiles", None),
                               ("POST", PLAN + "/validations", {})]:
        r = client.request(method, path, json=body, headers=agent)
        assert r.status_code == 403, (method, path, r.text)


def test_plans_write_implies_read_and_admin_does_everything(client: TestClient, writer: Headers,
                                                            admin: Headers) -> None:
    assert client.get("/v1/jobs", headers=writer).status_code == 200
    assert client.post("/v1/plans", json=BODY, headers=admin).status_code == 202
    assert client.get("/v1/profiles", headers=admin).status_code == 200
    hw = {"key": "cpu", "device": "cpu", "device_name": "x86", "device_count": 1, "memory_bytes": 1,
          "torch_version": "2"}
    assert client.post("/v1/agents/register", json={"name": "a", "hardware": hw}, headers=admin).status_code == 201


def test_health_and_docs_need_no_token(client: TestClient) -> None:
    for path in ("/healthz", "/readyz", "/metrics", "/openapi.json", "/docs"):
        assert client.get(path).status_code == 200, path


def test_scope_parsing() -> None:
    assert parse_scopes(["plans:read,agent", "admin"]) == {Scope.PLANS_READ, Scope.AGENT, Scope.ADMIN}
    with pytest.raises(ValueError, match="unknown scope"):
        parse_scopes(["plans:delete"])
    with pytest.raises(ValueError, match="at least one"):
        parse_scopes([","])

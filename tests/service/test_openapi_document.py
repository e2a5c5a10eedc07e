"""The OpenAPI document says what the service answers: every error status with the problem+json
schema, the accepted names and cursors; requests the document allows are accepted, and strings
that cannot be stored are a 422, never a 500."""

from __future__ import annotations

import re
import uuid
from typing import Any

from fastapi.testclient import TestClient

from parplan.service.pagination import CURSOR_PATTERN
from parplan.solver.frontends.presets import PRESETS
from parplan.solver.request import gpu_names

Headers = dict[str, str]
PROBLEM = "application/problem+json"


def _ops(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(m, p, op) for p, item in doc["paths"].items() for m, op in item.items() if m in ("get", "post")]


def test_every_error_status_is_a_documented_problem(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    for method, path, op in _ops(doc):
        responses = op["responses"]
        errors = {int(c) for c in responses if int(c) >= 400}
        for code in errors:
            assert list(responses[str(code)]["content"]) == [PROBLEM], (method, path, code)
        if path.startswith("/v1/"):
            assert {401, 403, 429} <= errors, (method, path)
            assert "Retry-After" in responses["429"]["headers"]
        if "requestBody" in op:
            assert {400, 413, 422} <= errors, (method, path)
        if "{" in path:
            assert 404 in errors, (method, path)
    assert "503" in doc["paths"]["/v1/plans"]["post"]["responses"]


def test_request_schemas_list_the_accepted_names_and_limits(client: TestClient) -> None:
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    gpu = schemas["ClusterSpec"]["properties"]["gpu"]
    assert gpu["enum"] == list(gpu_names()) and {"A100-80GB", "h100", "H100"} <= set(gpu["enum"])
    assert "a100" not in gpu["enum"]  # ambiguous: two sizes
    preset = schemas["ModelSpec"]["properties"]["preset"]["anyOf"][0]
    assert preset["enum"] == list(PRESETS)
    assert schemas["ClusterSpec"]["properties"]["gpus"]["maximum"] == 4096  # PARPLAN_MAX_DEVICES of the fixture


def test_names_in_the_enum_are_accepted_and_others_refused(client: TestClient, writer: Headers) -> None:
    for gpu in ("h100", "H200-141GB", "mi300x"):
        r = client.post("/v1/plans", json={"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": 8, "gpu": gpu}},
                        headers=writer)
        assert r.status_code in (200, 202), (gpu, r.text)
    for gpu in ("a100", "Z80", "h100 "):
        r = client.post("/v1/plans", json={"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": 8, "gpu": gpu}},
                        headers=writer)
        assert r.status_code == 422 and r.json()["errors"][0]["pointer"] == "#/cluster/gpu", gpu


def test_any_cursor_the_pattern_allows_is_accepted(client: TestClient, writer: Headers, reader: Headers) -> None:
    for gpus in (1, 2, 4):
        client.post("/v1/plans", json={"model": {"preset": "bert-large"}, "cluster": {"gpus": gpus}}, headers=writer)
    page = client.get("/v1/jobs", params={"limit": 1}, headers=reader).json()
    assert re.match(CURSOR_PATTERN, page["next_cursor"])
    assert len(client.get("/v1/jobs", params={"cursor": page["next_cursor"]}, headers=reader).json()["jobs"]) >= 2
    for made_up in ("0." + "0" * 32, "99999999999999999." + "f" * 32):
        r = client.get("/v1/jobs", params={"cursor": made_up}, headers=reader)
        assert r.status_code == 200, r.text
    r = client.get("/v1/jobs", params={"cursor": "0" * 200}, headers=reader)
    assert r.status_code == 422 and r.headers["content-type"] == PROBLEM


def test_unstorable_strings_are_422_not_500(client: TestClient, agent: Headers) -> None:
    for raw, pointer in ((b'{"hardware_key": "k", "kind": "validation", "data": {"a": "x\\u0000y"}}', "#/data/a"),
                         (b'{"hardware_key": "k\\ud800", "kind": "validation", "data": {}}', "#/hardware_key"),
                         (b'{"hardware_key": "k", "kind": "validation", "data": {"\\udfff": 1}}', None)):
        r = client.post("/v1/profiles", content=raw, headers={**agent, "content-type": "application/json"})
        assert r.status_code == 422 and r.headers["content-type"] == PROBLEM, r.text
        if pointer:
            assert r.json()["errors"][0]["pointer"] == pointer
    ok = b'{"hardware_key": "k", "kind": "validation", "data": {"smile": "\\ud83d\\ude00"}}'  # a surrogate pair
    assert client.post("/v1/profiles", content=ok, headers={**agent, "content-type": "application/json"}
                       ).status_code == 201


def test_a_wrong_method_lists_the_paths_own_methods(client: TestClient, agent: Headers) -> None:
    r = client.get("/v1/validations/claim", headers=agent)
    assert r.status_code == 405 and r.headers["allow"] == "POST" and r.headers["content-type"] == PROBLEM
    r = client.delete("/v1/profiles", headers=agent)
    assert r.status_code == 405 and r.headers["allow"] == "GET, POST"
    for ident in (uuid.uuid4(), "not-a-uuid"):
        r = client.get(f"/v1/validations/{ident}", headers=agent)
        assert r.status_code == 404 and r.headers["content-type"] == PROBLEM

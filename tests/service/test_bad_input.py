"""Bad input never gets a 500: malformed JSON, wrong types, cyclic graphs, huge bodies, unknown
presets and GPUs all answer 4xx problem+json naming the failing field."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

Headers = dict[str, str]
PROBLEM = "application/problem+json"
GOOD: dict[str, Any] = {"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": 8}}


def problem(r: Any, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == PROBLEM
    doc: dict[str, Any] = r.json()
    assert doc["status"] == status and doc["title"] and doc["detail"] and doc["type"]
    return doc


def fields(doc: dict[str, Any]) -> list[str]:
    return [e["field"] for e in doc.get("errors", [])]


def test_malformed_json_is_400(client: TestClient, writer: Headers) -> None:
    for raw in (b"{bad", b'{"model": ', b"\xff\xfe", b""):
        r = client.post("/v1/plans", content=raw, headers=writer | {"content-type": "application/json"})
        assert r.status_code in (400, 422), r.text
        problem(r, r.status_code)


def test_json_that_is_not_an_object_is_422(client: TestClient, writer: Headers) -> None:
    for body in ([1, 2], "text", 42, None):
        problem(client.post("/v1/plans", json=body, headers=writer), 422)


@pytest.mark.parametrize(("body", "field"), [
    ({"model": {"preset": 5}, "cluster": {"gpus": 8}}, "model.preset"),
    ({"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": "eight"}}, "cluster.gpus"),
    ({"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": 8.5}}, "cluster.gpus"),
    ({"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": True}}, "cluster.gpus"),
    ({"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": 0}}, "cluster.gpus"),
    ({"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": -8}}, "cluster.gpus"),
    ({"model": {"preset": "gpt-1.7b"}}, "cluster"),
    ({"cluster": {"gpus": 8}}, "model"),
    ({"model": {}, "cluster": {"gpus": 8}}, "model"),
    ({"model": {"preset": "gpt-1.7b", "graph": {}}, "cluster": {"gpus": 8}}, "model"),
    ({"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": 8}, "training": {"global_batch": "16"}},
     "training.global_batch"),
    ({"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": 8}, "objective": {"kind": "fastest"}}, "objective.kind"),
    ({"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": 8}, "training": {"global_batch": 63, "micro_batch": 2}},
     "training.micro_batch"),
    ({"model": {"preset": "bert-large"}, "cluster": {"gpus": 8}, "training": {"seq_len": 1024}},
     "training.seq_len"),
    ({"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": 8}, "search": "simplex"}, "search"),
    ({"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": 8}, "surprise": 1}, "surprise"),
    ({"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": 8, "gpu_memory_gib": -1}}, "cluster.gpu_memory_gib"),
])
def test_wrong_types_and_values_name_the_field(client: TestClient, writer: Headers, body: dict[str, Any],
                                               field: str) -> None:
    doc = problem(client.post("/v1/plans", json=body, headers=writer), 422)
    assert field in fields(doc), doc
    err = next(e for e in doc["errors"] if e["field"] == field)
    assert err["pointer"] == "#/" + field.replace(".", "/") and err["loc"][0] == "body"


def test_unknown_preset_is_422_at_model_preset(client: TestClient, writer: Headers) -> None:
    doc = problem(client.post("/v1/plans", json={"model": {"preset": "gpt-9000"}, "cluster": {"gpus": 8}},
                              headers=writer), 422)
    assert fields(doc) == ["model.preset"] and "gpt-9000" in doc["detail"]


def test_unknown_gpu_is_422_at_cluster(client: TestClient, writer: Headers) -> None:
    body = copy.deepcopy(GOOD)
    body["cluster"]["gpu"] = "Z80"
    doc = problem(client.post("/v1/plans", json=body, headers=writer), 422)
    assert fields(doc)[0].startswith("cluster") and "Z80" in doc["detail"]


def test_cyclic_graph_is_422_naming_the_node(client: TestClient, writer: Headers, mlp_graph: dict[str, Any]) -> None:
    graph = copy.deepcopy(mlp_graph)
    graph["nodes"][2]["inputs"] = ["y", "w1"]  # h reads y, y depends on h
    doc = problem(client.post("/v1/plans", json={"model": {"graph": graph}, "cluster": {"gpus": 2}},
                              headers=writer), 422)
    assert "cycle" in doc["detail"]
    err = doc["errors"][0]
    assert err["node"] in ("h", "a", "y") and err["pointer"].startswith("#/model/graph/nodes/")


def test_graph_with_a_bad_node_points_at_it(client: TestClient, writer: Headers, mlp_graph: dict[str, Any]) -> None:
    graph = copy.deepcopy(mlp_graph)
    graph["nodes"][3]["inputs"] = ["missing"]
    doc = problem(client.post("/v1/plans", json={"model": {"graph": graph}, "cluster": {"gpus": 2}},
                              headers=writer), 422)
    assert any(e["pointer"].startswith("#/model/graph/nodes/3") and e["node"] == "a" for e in doc["errors"]), doc


def test_a_10_mb_body_is_413(client: TestClient, writer: Headers) -> None:
    huge = json.dumps({"model": {"hf_config": {"pad": "x" * (10 * 2**20)}}, "cluster": {"gpus": 8}})
    doc = problem(client.post("/v1/plans", content=huge, headers=writer | {"content-type": "application/json"}),
                  413)
    assert "PARPLAN_MAX_BODY_BYTES" in doc["detail"]


def test_a_streamed_body_without_length_is_cut_at_the_limit(client: TestClient, writer: Headers) -> None:
    def chunks() -> Any:
        yield b'{"model": {"hf_config": {"pad": "'
        for _ in range(12):
            yield b"x" * 2**20
        yield b'"}}, "cluster": {"gpus": 8}}'
    r = client.post("/v1/plans", content=chunks(), headers=writer | {"content-type": "application/json"})
    problem(r, 413)


def test_too_many_graph_nodes_is_413(client: TestClient, writer: Headers, mlp_graph: dict[str, Any]) -> None:
    graph = copy.deepcopy(mlp_graph)
    graph["nodes"] += [{"id": f"p{i}", "kind": "parameter", "dims": {"n": 4}} for i in range(300)]  # limit: 200
    doc = problem(client.post("/v1/plans", json={"model": {"graph": graph}, "cluster": {"gpus": 2}},
                              headers=writer), 413)
    assert "PARPLAN_MAX_GRAPH_NODES" in doc["detail"] and fields(doc) == ["model.graph.nodes"]


def test_too_many_devices_is_422(client: TestClient, writer: Headers) -> None:
    doc = problem(client.post("/v1/plans", json={"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": 8192}},
                              headers=writer), 422)  # limit: 4096
    assert fields(doc) == ["cluster.gpus"] and "PARPLAN_MAX_DEVICES" in doc["detail"]


def test_solver_level_request_errors_name_the_field(client: TestClient, writer: Headers) -> None:
    body = {"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": 8, "gpus_per_node": 3}}
    r = client.post("/v1/plans", json=body, headers=writer)
    assert r.status_code in (202, 422)
    if r.status_code == 422:
        assert fields(problem(r, 422))[0].startswith("cluster")


def test_bad_query_parameters_are_422(client: TestClient, reader: Headers) -> None:
    problem(client.get("/v1/jobs?status=sleeping", headers=reader), 422)
    problem(client.get("/v1/jobs?limit=0", headers=reader), 422)
    doc = problem(client.get("/v1/jobs?cursor=%%%", headers=reader), 422)
    assert fields(doc) == ["cursor"]


def test_unknown_routes_and_methods_are_problems(client: TestClient, reader: Headers) -> None:
    problem(client.get("/v1/nothing", headers=reader), 404)
    problem(client.delete("/v1/plans", headers=reader), 405)


scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20))
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20)
bodies = st.fixed_dictionaries({}, optional={
    "model": st.one_of(json_values, st.fixed_dictionaries({"preset": json_values}),
                       st.fixed_dictionaries({"graph": json_values}),
                       st.fixed_dictionaries({"hf_config": json_values})),
    "cluster": st.one_of(json_values, st.fixed_dictionaries({"gpus": json_values}, optional={
        "gpu": json_values, "gpus_per_node": json_values, "gpu_memory_gib": json_values})),
    "training": json_values, "objective": json_values, "search": json_values, "time_limit": json_values})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies)
def test_no_body_gets_a_500(client: TestClient, writer: Headers, body: dict[str, Any]) -> None:
    r = client.post("/v1/plans", json=body, headers=writer)
    assert r.status_code < 500, (body, r.text)


@pytest.mark.parametrize("patch", [
    {"cluster": {"gpus": 8, "gpu_memory_gib": 1e308}},
    {"cluster": {"gpus": 8, "gpus_per_node": 2**62}},
    {"training": {"global_batch": 2**62}},
    {"training": {"seq_len": 2**62}},
    {"training": {"micro_batch": 2**62}},
    {"objective": {"alpha": 1e308, "memory_budget_gib": 1e308, "max_slowdown": 1e308}},
    {"time_limit": 1e-300},
    {"cluster": {"gpus": 2**62}},
])
def test_extreme_numbers_are_accepted_or_422(client: TestClient, writer: Headers, patch: dict[str, Any]) -> None:
    r = client.post("/v1/plans", json=GOOD | patch, headers=writer)
    assert r.status_code in (202, 422), r.text

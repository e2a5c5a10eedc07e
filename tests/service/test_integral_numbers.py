"""Integers written as ``1025196.0``, which JSON Schema counts as integers, are accepted wherever the
published schema says ``"type": "integer"``, and read as the integers they are, on each operation
whose body has one or carries an agent registered with them (the six Schemathesis found refusing
them): register, evaluations, plans, profiles, claim, result."""

from __future__ import annotations

import json
import uuid
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from parplan.service.models import Plan
from parplan.solver.request import request_hash

Headers = dict[str, str]
HW: dict[str, Any] = {"key": "A100-80GB", "device": "cuda", "device_name": "NVIDIA A100-SXM4-80GB",
                      "device_count": 8.0, "memory_bytes": 1025196.0, "torch_version": "2.13.0"}
PLAN: dict[str, Any] = {"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": 8.0, "gpus_per_node": 8.0},
                        "training": {"global_batch": 16.0, "seq_len": 1024.0, "micro_batch": 1.0}, "mesh": [2.0, 4.0]}
AS_INTS: dict[str, Any] = {"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": 8, "gpus_per_node": 8},
                           "training": {"global_batch": 16, "seq_len": 1024, "micro_batch": 1}, "mesh": [2, 4]}


def _integer_types(schema: Any) -> int:
    """How many ``"type": "integer"`` a schema holds (so the bodies above test integer fields)."""
    if isinstance(schema, dict):
        return (schema.get("type") == "integer") + sum(_integer_types(v) for v in schema.values())
    if isinstance(schema, list):
        return sum(_integer_types(v) for v in schema)
    return 0


def test_the_fields_written_as_floats_are_integers_in_the_schema(client: TestClient) -> None:
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    for name, fields in (("HardwareIn", ("device_count", "memory_bytes")), ("ClusterSpec", ("gpus", "gpus_per_node")),
                         ("TrainingSpec", ("global_batch", "seq_len", "micro_batch")),
                         ("EvaluationCluster", ("gpus",)), ("Shrink", ("layers", "hidden"))):
        for f in fields:
            assert _integer_types(schemas[name]["properties"][f]) == 1, (name, f)
    assert _integer_types(schemas["PlanRequestIn"]["properties"]["mesh"]) == 1


def test_plans_read_integral_floats_as_integers(client: TestClient, writer: Headers) -> None:
    r = client.post("/v1/plans", json=PLAN, headers=writer)
    assert r.status_code == 202, r.text
    job = r.json()["job"]
    assert job["request_hash"] == request_hash(AS_INTS) == request_hash(PLAN)
    assert client.post("/v1/plans", json=AS_INTS, headers=writer).json()["job"]["id"] == job["id"]  # one request
    for bad in ({"gpus": 8.5}, {"gpus": True}, {"gpus": "8"}):
        r = client.post("/v1/plans", json=PLAN | {"cluster": bad}, headers=writer)
        assert r.status_code == 422 and r.json()["errors"][0]["field"] == "cluster.gpus", r.text


def test_evaluations_read_integral_floats_as_integers(client: TestClient, reader: Headers) -> None:
    ds = {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
          "zero_optimization": {"stage": 3}, "bf16": {"enabled": True}}
    body = {"kind": "ds-config", "text": json.dumps(ds), "model": {"preset": "llama-2-7b"}, "seq_len": 4096.0,
            "cluster": {"gpus": 8.0, "gpus_per_node": 8.0}}
    r = client.post("/v1/evaluations", json=body, headers=reader)
    assert r.status_code == 200, r.text
    ints = client.post("/v1/evaluations", json=body | {"seq_len": 4096, "cluster": {"gpus": 8, "gpus_per_node": 8}},
                       headers=reader)
    assert r.json() == ints.json()


def test_the_agent_protocol_reads_integral_floats_as_integers(client: TestClient, writer: Headers, agent: Headers,
                                                              db: sessionmaker[Session]) -> None:
    r = client.post("/v1/agents/register", json={"name": "floats", "hardware": HW}, headers=agent)
    assert r.status_code == 201, r.text
    a = r.json()["agent"]
    assert a["hardware"]["device_count"] == 8 and a["hardware"]["memory_bytes"] == 1025196
    assert isinstance(a["hardware"]["memory_bytes"], int)
    r = client.post("/v1/profiles", json={"hardware_key": "A100-80GB", "kind": "microbenchmark", "agent_id": a["id"],
                                          "data": {"runs": 3.0}}, headers=agent)
    assert r.status_code == 201, r.text
    with db() as s:
        plan = Plan(cache_key=uuid.uuid4().hex, request_hash="h", solver_version="t", calibration_source="default",
                    request=AS_INTS, document={"strategy": {"summary": "tp2 pp1 dp4"}, "memory": {"peak_bytes": 1}})
        s.add(plan)
        s.commit()
        plan_id = str(plan.id)
    r = client.post(f"/v1/plans/{plan_id}/validations", json={"shrink": {"layers": 2.0, "hidden": 256.0}},
                    headers=writer)
    assert r.status_code == 202, r.text
    vid = r.json()["validation"]["id"]
    assert r.json()["validation"]["shrink"] == {"layers": 2, "hidden": 256}
    r = client.post("/v1/validations/claim", json={"agent_id": a["id"], "wait_seconds": 0.0}, headers=agent)
    assert r.status_code == 200 and r.json()["validation"]["id"] == vid, r.text
    measurement = {"hardware_key": "A100-80GB", "ranks": [
        {"rank": 0.0, "measured": {"peak_bytes": 1025196.0}, "predicted": {"peak_bytes": 1000000.0}}]}
    r = client.post(f"/v1/validations/{vid}/result", headers=agent,
                    json={"agent_id": a["id"], "status": "succeeded", "measurement": measurement})
    assert r.status_code == 200 and r.json()["validation"]["status"] == "succeeded", r.text

"""The validation agent's side of the API: register, heartbeat, claim (long poll), result,
profiles and calibrations; abandoned claims go back to the queue."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from parplan.service.auth.service import Scope
from parplan.service.database import utcnow
from parplan.service.models import Agent, Job, JobStatus, Plan, Profile
from parplan.service.runtime import Runtime
from parplan.service.sweeper import sweep

Headers = dict[str, str]
HW = {"key": "A100-80GB", "device": "cuda", "device_name": "NVIDIA A100-SXM4-80GB", "device_count": 8,
      "memory_bytes": 80 * 2**30, "torch_version": "2.13.0"}
REQUEST = {"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": 8}}
MEASUREMENT = {"hardware_key": "A100-80GB", "max_relative_error": 0.05, "ranks": [
    {"rank": 0, "measured": {"peak_bytes": 1000, "breakdown": {"parameters": 400, "activations": 600}},
     "predicted": {"peak_bytes": 1050, "breakdown": {"parameters": 400, "activations": 650}}},
    {"rank": 1, "measured": {"peak_bytes": 900, "breakdown": {"parameters": 400, "activations": 500}},
     "predicted": {"peak_bytes": 950, "breakdown": {"parameters": 400, "activations": 550}}}]}


def _plan(db: sessionmaker[Session]) -> str:
    with db() as s:
        plan = Plan(cache_key=uuid.uuid4().hex, request_hash="h", solver_version="t", calibration_source="default",
                    request=REQUEST, document={"strategy": {"summary": "tp2 pp1 dp4"}, "memory": {"peak_bytes": 1}})
        s.add(plan)
        s.commit()
        return str(plan.id)


def _register(client: TestClient, headers: Headers, name: str = "gpu-box") -> dict[str, Any]:
    r = client.post("/v1/agents/register", json={"name": name, "hardware": HW}, headers=headers)
    assert r.status_code == 201, r.text
    agent: dict[str, Any] = r.json()["agent"]
    return agent


def test_register_and_heartbeat(client: TestClient, agent: Headers, reader: Headers) -> None:
    a = _register(client, agent)
    assert a["name"] == "gpu-box" and a["hardware"]["key"] == "A100-80GB" and a["last_heartbeat_at"]
    time.sleep(0.01)
    b = client.post(f"/v1/agents/{a['id']}/heartbeat", headers=agent)
    assert b.status_code == 200 and b.json()["agent"]["last_heartbeat_at"] > a["last_heartbeat_at"]
    assert client.post(f"/v1/agents/{uuid.uuid4()}/heartbeat", headers=agent).status_code == 404
    listed = client.get("/v1/agents", headers=reader).json()["agents"]
    assert [x["id"] for x in listed] == [a["id"]]


def test_register_validates_the_hardware(client: TestClient, agent: Headers) -> None:
    bad = HW | {"device": "tpu"}
    r = client.post("/v1/agents/register", json={"name": "x", "hardware": bad}, headers=agent)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "hardware.device"


def test_an_agent_cannot_act_for_another_tokens_agent(client: TestClient, auth: Callable[..., Headers]) -> None:
    mine, theirs = auth(Scope.AGENT), auth(Scope.AGENT)
    a = _register(client, mine)
    assert client.post(f"/v1/agents/{a['id']}/heartbeat", headers=theirs).status_code == 403
    r = client.post("/v1/validations/claim", json={"agent_id": a["id"]}, headers=theirs)
    assert r.status_code == 403


def test_validation_round_trip(client: TestClient, writer: Headers, agent: Headers, reader: Headers,
                               db: sessionmaker[Session]) -> None:
    plan_id = _plan(db)
    a = _register(client, agent)
    r = client.post(f"/v1/plans/{plan_id}/validations", json={"shrink": {"layers": 2, "hidden": None}},
                    headers=writer)
    assert r.status_code == 202, r.text
    v = r.json()["validation"]
    assert r.headers["location"] == f"/v1/validations/{v['id']}"
    assert v["status"] == "queued" and v["plan_id"] == plan_id and v["shrink"] == {"layers": 2, "hidden": None}

    claimed = client.post("/v1/validations/claim", json={"agent_id": a["id"], "wait_seconds": 0}, headers=agent)
    assert claimed.status_code == 200, claimed.text
    c = claimed.json()["validation"]
    assert c["id"] == v["id"] and c["status"] == "running" and c["agent_id"] == a["id"] and c["claimed_at"]
    assert c["plan"]["id"] == plan_id and c["plan"]["strategy"]["summary"] == "tp2 pp1 dp4"
    assert c["request"] == REQUEST and c["shrink"] == {"layers": 2, "hidden": None}
    # Nothing else queued: 204 at once.
    assert client.post("/v1/validations/claim", json={"agent_id": a["id"]}, headers=agent).status_code == 204

    done = client.post(f"/v1/validations/{v['id']}/result", headers=agent, json={
        "agent_id": a["id"], "status": "succeeded", "error": None, "measurement": MEASUREMENT})
    assert done.status_code == 200, done.text
    got = client.get(f"/v1/validations/{v['id']}", headers=reader).json()["validation"]
    assert got["status"] == "succeeded" and got["finished_at"] and got["result"]["measurement"] == MEASUREMENT
    assert client.get(f"/v1/validations/{v['id']}", headers=agent).status_code == 200  # agents may read too
    # Posting the same outcome again is harmless; a different one is a conflict.
    same = {"agent_id": a["id"], "status": "succeeded", "measurement": MEASUREMENT}
    assert client.post(f"/v1/validations/{v['id']}/result", json=same, headers=agent).status_code == 200
    other = {"agent_id": a["id"], "status": "failed", "error": "oops"}
    assert client.post(f"/v1/validations/{v['id']}/result", json=other, headers=agent).status_code == 409

    profiles = client.get("/v1/profiles", params={"hardware_key": "A100-80GB", "kind": "validation"},
                          headers=reader).json()["profiles"]
    assert len(profiles) == 1
    p = profiles[0]
    assert p["validation_id"] == v["id"] and p["agent_id"] == a["id"] and p["gpu"] == "A100-80GB"
    acts = p["data"]["categories"]["activations"]
    assert acts[0] == {"rank": 0, "measured": 600.0, "predicted": 650.0, "relative_error": pytest.approx(50 / 600)}
    assert {r["rank"] for r in p["data"]["categories"]["peak_bytes"]} == {0, 1}


def test_result_rules(client: TestClient, writer: Headers, agent: Headers, db: sessionmaker[Session]) -> None:
    plan_id = _plan(db)
    a = _register(client, agent)
    vid = client.post(f"/v1/plans/{plan_id}/validations", headers=writer).json()["validation"]["id"]
    body = {"agent_id": a["id"], "status": "failed", "error": "CUDA OOM"}
    assert client.post(f"/v1/validations/{vid}/result", json=body, headers=agent).status_code == 409  # not claimed
    client.post("/v1/validations/claim", json={"agent_id": a["id"]}, headers=agent)
    no_measure = {"agent_id": a["id"], "status": "succeeded"}
    r = client.post(f"/v1/validations/{vid}/result", json=no_measure, headers=agent)
    assert r.status_code == 422
    r = client.post(f"/v1/validations/{vid}/result", json=body, headers=agent)
    assert r.status_code == 200 and r.json()["validation"]["error"] == "CUDA OOM"
    assert client.post(f"/v1/plans/{uuid.uuid4()}/validations", headers=writer).status_code == 404
    assert client.post("/v1/validations/claim", json={"agent_id": str(uuid.uuid4())},
                       headers=agent).status_code == 404
    r = client.post("/v1/validations/claim", json={"agent_id": a["id"], "wait_seconds": 31}, headers=agent)
    assert r.status_code == 422


def test_an_agent_posts_results_only_for_validations_it_claimed(client: TestClient, writer: Headers,
                                                                 auth: Callable[..., Headers],
                                                                 db: sessionmaker[Session]) -> None:
    """Agent A claims; agent B (same token, then another token's) cannot post its result, nor post
    for A; A's own result is then accepted and B's attempt changed nothing."""
    token_a, token_b = auth(Scope.AGENT), auth(Scope.AGENT)
    a, b_same = _register(client, token_a, "a"), _register(client, token_a, "b")
    b_other = _register(client, token_b, "c")
    vid = client.post(f"/v1/plans/{_plan(db)}/validations", headers=writer).json()["validation"]["id"]
    claimed = client.post("/v1/validations/claim", json={"agent_id": a["id"]}, headers=token_a).json()
    assert claimed["validation"]["id"] == vid
    failed = {"status": "failed", "error": "not mine"}
    r = client.post(f"/v1/validations/{vid}/result", json={"agent_id": b_same["id"], **failed}, headers=token_a)
    assert r.status_code == 409  # held by another agent
    r = client.post(f"/v1/validations/{vid}/result", json={"agent_id": b_other["id"], **failed}, headers=token_b)
    assert r.status_code == 409
    r = client.post(f"/v1/validations/{vid}/result", json={"agent_id": a["id"], **failed}, headers=token_b)
    assert r.status_code == 403  # another token's agent
    r = client.post(f"/v1/validations/{vid}/result", json={"agent_id": a["id"], "status": "failed", "error": "OOM"},
                    headers=token_a)
    assert r.status_code == 200 and r.json()["validation"]["error"] == "OOM"


def test_claim_long_polls_until_a_validation_arrives(client: TestClient, writer: Headers, agent: Headers,
                                                     db: sessionmaker[Session]) -> None:
    a = _register(client, agent)
    t0 = time.monotonic()
    r = client.post("/v1/validations/claim", json={"agent_id": a["id"], "wait_seconds": 0.6}, headers=agent)
    assert r.status_code == 204 and 0.5 <= time.monotonic() - t0 < 3
    plan_id = _plan(db)
    client.post(f"/v1/plans/{plan_id}/validations", headers=writer)
    r = client.post("/v1/validations/claim", json={"agent_id": a["id"], "wait_seconds": 5}, headers=agent)
    assert r.status_code == 200


def test_an_abandoned_claim_goes_back_to_the_queue(client: TestClient, writer: Headers, agent: Headers,
                                                   db: sessionmaker[Session], runtime: Runtime) -> None:
    plan_id = _plan(db)
    a, b = _register(client, agent, "a"), _register(client, agent, "b")
    vid = client.post(f"/v1/plans/{plan_id}/validations", headers=writer).json()["validation"]["id"]
    assert client.post("/v1/validations/claim", json={"agent_id": a["id"]}, headers=agent).status_code == 200
    sweep(db, runtime.queue, runtime.settings)
    assert client.post("/v1/validations/claim", json={"agent_id": b["id"]}, headers=agent).status_code == 204
    stale = utcnow() - timedelta(seconds=runtime.settings.agent_timeout_seconds + 1)
    with db() as s:
        s.execute(update(Agent).where(Agent.id == uuid.UUID(a["id"])).values(last_heartbeat_at=stale))
        s.commit()
    report = sweep(db, runtime.queue, runtime.settings)
    assert report.requeued_validations == [vid]
    got = client.post("/v1/validations/claim", json={"agent_id": b["id"]}, headers=agent)
    assert got.status_code == 200 and got.json()["validation"]["agent_id"] == b["id"]
    # The first agent's late result is refused.
    late = {"agent_id": a["id"], "status": "failed", "error": "late"}
    assert client.post(f"/v1/validations/{vid}/result", json=late, headers=agent).status_code == 409


def test_profiles_store_and_list(client: TestClient, agent: Headers, reader: Headers) -> None:
    for i in range(3):
        r = client.post("/v1/profiles", json={"hardware_key": "H100-80GB", "kind": "microbenchmark",
                                              "data": {"run": i}}, headers=agent)
        assert r.status_code == 201
    client.post("/v1/profiles", json={"hardware_key": "cpu-x86", "kind": "validation", "data": {}}, headers=agent)
    page1 = client.get("/v1/profiles", params={"hardware_key": "H100-80GB", "limit": 2}, headers=reader).json()
    page2 = client.get("/v1/profiles", params={"hardware_key": "H100-80GB", "cursor": page1["next_cursor"]},
                       headers=reader).json()
    assert [p["data"]["run"] for p in page1["profiles"] + page2["profiles"]] == [2, 1, 0]
    assert page2["next_cursor"] is None
    cpu = client.get("/v1/profiles", params={"kind": "validation"}, headers=reader).json()["profiles"]
    assert [p["hardware_key"] for p in cpu] == ["cpu-x86"] and cpu[0]["gpu"] is None


def test_a_bad_calibration_is_422(client: TestClient, agent: Headers) -> None:
    r = client.post("/v1/profiles", json={"hardware_key": "H100", "kind": "microbenchmark",
                                          "data": {"calibration": {"memory_efficiency": 3}}}, headers=agent)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "data.calibration"


def test_the_newest_calibration_wins_and_gets_a_source(client: TestClient, agent: Headers,
                                                       writer: Headers, db: sessionmaker[Session]) -> None:
    for eff in (0.4, 0.45):
        client.post("/v1/profiles", json={"hardware_key": "H100", "kind": "microbenchmark",
                                          "data": {"calibration": {"matmul_efficiency": {"bf16": eff}}}},
                    headers=agent)
    jid = client.post("/v1/plans", json={"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": 8, "gpu": "h100"}},
                      headers=writer).json()["job"]["id"]
    with db() as s:
        job = s.get(Job, uuid.UUID(jid))
        assert job is not None and job.status == JobStatus.QUEUED.value and job.calibration is not None
        assert job.calibration["matmul_efficiency"] == {"bf16": 0.45}
        assert job.calibration["source"].startswith("agent:H100@")
        assert s.query(Profile).count() == 2

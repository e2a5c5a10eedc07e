"""POST /v1/plans: validation, job creation (enqueued after commit into the real Redis queue),
the plan cache and deduplication of identical requests in flight."""

from __future__ import annotations

import copy
import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from parplan.service.database import utcnow
from parplan.service.models import Job, JobStatus, Plan
from parplan.service.plans.service import cache_key
from parplan.solver.request import request_hash
from parplan.workers.celery_app import CeleryJobQueue

Headers = dict[str, str]
BODY: dict[str, Any] = {"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": 8, "gpu": "A100-80GB"},
                        "training": {"global_batch": 16, "seq_len": 2048}, "objective": {"kind": "min-memory"}}


def test_submit_queues_a_job_and_enqueues_it_after_commit(client: TestClient, writer: Headers,
                                                          queue: CeleryJobQueue,
                                                          db: sessionmaker[Session]) -> None:
    r = client.post("/v1/plans", json=BODY, headers=writer)
    assert r.status_code == 202, r.text
    job = r.json()["job"]
    assert r.headers["location"] == f"/v1/jobs/{job['id']}" == job["url"]
    assert job["status"] == "queued" and job["progress"] == {"stage": "queued", "fraction": 0.0}
    assert job["request_hash"] == request_hash(BODY) and job["plan_id"] is None and job["error"] is None
    assert queue.depth() == 1  # the message is in Redis
    with db() as s:
        row = s.get(Job, uuid.UUID(job["id"]))
        assert row is not None and row.status == "queued" and row.request == BODY and row.enqueued_at is not None


def test_the_same_request_in_flight_shares_one_job(client: TestClient, writer: Headers,
                                                   queue: CeleryJobQueue) -> None:
    a = client.post("/v1/plans", json=BODY, headers=writer).json()["job"]
    reordered = {"objective": BODY["objective"], "training": BODY["training"], "cluster": BODY["cluster"],
                 "model": BODY["model"]}
    b = client.post("/v1/plans", json=reordered, headers=writer)
    assert b.status_code == 202 and b.json()["job"]["id"] == a["id"]
    assert queue.depth() == 1


def _store_solved(db: sessionmaker[Session], body: dict[str, Any]) -> tuple[Plan, Job]:
    rh = request_hash(body)
    with db() as s:
        plan = Plan(cache_key=cache_key(rh, None), request_hash=rh, solver_version="test", calibration_source="default",
                    request=body, document={"memory": {"peak_bytes": 123}, "time": {"step_seconds": 1.5},
                                            "strategy": {"summary": "tp2"}, "solver": {"status": "optimal"}})
        s.add(plan)
        s.flush()
        now = utcnow()
        job = Job(status=JobStatus.SUCCEEDED.value, request=body, request_hash=rh, cache_key=plan.cache_key,
                  plan_id=plan.id, progress_stage="done", progress_fraction=1.0, created_at=now, updated_at=now,
                  started_at=now, finished_at=now, attempts=1)
        s.add(job)
        s.commit()
        return plan, job


def test_a_solved_request_is_served_from_the_cache(client: TestClient, writer: Headers, reader: Headers,
                                                   db: sessionmaker[Session], queue: CeleryJobQueue) -> None:
    plan, job = _store_solved(db, BODY)
    # Defaults spelled out and keys reordered: the same canonical request.
    same = copy.deepcopy(BODY) | {"search": "auto"}
    same["objective"]["max_slowdown"] = 0.1
    r = client.post("/v1/plans", json=same, headers=writer)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["cached"] is True and doc["job"]["id"] == str(job.id) and doc["job"]["status"] == "succeeded"
    assert doc["plan"]["id"] == str(plan.id) and doc["plan"]["memory"]["peak_bytes"] == 123
    assert "location" not in r.headers and queue.depth() == 0
    got = client.get(f"/v1/plans/{plan.id}", headers=reader)
    assert got.status_code == 200 and got.json() == doc["plan"]


def test_a_different_request_is_not_served_from_the_cache(client: TestClient, writer: Headers,
                                                          db: sessionmaker[Session]) -> None:
    _store_solved(db, BODY)
    other = copy.deepcopy(BODY)
    other["cluster"]["gpus"] = 16
    assert client.post("/v1/plans", json=other, headers=writer).status_code == 202


def test_a_calibration_for_the_gpu_changes_the_cache_key_and_travels_with_the_job(
        client: TestClient, writer: Headers, agent: Headers, db: sessionmaker[Session]) -> None:
    _store_solved(db, BODY)
    cal = {"matmul_efficiency": {"bf16": 0.61}, "memory_efficiency": 0.7, "source": "agent:A100-80GB@bench"}
    r = client.post("/v1/profiles", json={"hardware_key": "a100_80gb", "kind": "microbenchmark",
                                          "data": {"calibration": cal}}, headers=agent)
    assert r.status_code == 201, r.text
    assert r.json()["profile"]["gpu"] == "A100-80GB"
    sub = client.post("/v1/plans", json=BODY, headers=writer)
    assert sub.status_code == 202  # the cached plan was solved without this calibration
    with db() as s:
        job = s.get(Job, uuid.UUID(sub.json()["job"]["id"]))
        assert job is not None and job.calibration is not None
        assert job.calibration["source"] == "agent:A100-80GB@bench"
        assert job.calibration["matmul_efficiency"] == {"bf16": 0.61}
        assert job.cache_key != job.request_hash == request_hash(BODY)
    # Another GPU is untouched by it.
    h100 = copy.deepcopy(BODY)
    h100["cluster"]["gpu"] = "H100-80GB"
    with db() as s:
        jid = client.post("/v1/plans", json=h100, headers=writer).json()["job"]["id"]
        job = s.get(Job, uuid.UUID(jid))
        assert job is not None and job.calibration is None and job.cache_key == job.request_hash


def test_hf_config_and_graph_models_are_accepted(client: TestClient, writer: Headers,
                                                  mlp_graph: dict[str, Any]) -> None:
    hf = {"model_type": "gpt2", "n_layer": 2, "n_embd": 256, "n_head": 4, "vocab_size": 1000, "n_positions": 128}
    r = client.post("/v1/plans", json={"model": {"hf_config": hf}, "cluster": {"gpus": 2}}, headers=writer)
    assert r.status_code == 202, r.text
    r = client.post("/v1/plans", json={"model": {"graph": mlp_graph}, "cluster": {"gpus": 2}}, headers=writer)
    assert r.status_code == 202, r.text


def test_plans_read_404_for_unknown_and_malformed_ids(client: TestClient, reader: Headers) -> None:
    for ident in ("00000000-0000-0000-0000-000000000000", "not-a-uuid"):
        r = client.get(f"/v1/plans/{ident}", headers=reader)
        assert r.status_code == 404 and r.headers["content-type"] == "application/problem+json"


@pytest.mark.parametrize("search", ["auto", "ilp", "dp"])
def test_every_search_kind_is_accepted(client: TestClient, writer: Headers, search: str) -> None:
    assert client.post("/v1/plans", json=BODY | {"search": search}, headers=writer).status_code == 202


def test_pareto_is_accepted_and_is_its_own_cache_entry(client: TestClient, writer: Headers) -> None:
    """``pareto: true`` (the DP's whole frontier) is part of the request and of its cache key;
    ``pareto: false`` is the default and keeps the key of a request that leaves it out."""
    whole = client.post("/v1/plans", json=BODY | {"pareto": True}, headers=writer)
    assert whole.status_code == 202, whole.text
    assert whole.json()["job"]["request_hash"] == request_hash(BODY | {"pareto": True}) != request_hash(BODY)
    assert request_hash(BODY | {"pareto": False}) == request_hash(BODY)
    bad = client.post("/v1/plans", json=BODY | {"pareto": "yes"}, headers=writer)
    assert bad.status_code == 422, bad.text


def test_a_fixed_mesh_is_accepted_and_checked(client: TestClient, writer: Headers) -> None:
    """``mesh`` (README: the ILP's device mesh, top level) reaches the solver's request; one that does
    not factor the GPUs is a 422 naming the field."""
    ok = client.post("/v1/plans", json=BODY | {"mesh": [2, 4]}, headers=writer)
    assert ok.status_code == 202, ok.text
    assert ok.json()["job"]["request_hash"] == request_hash(BODY | {"mesh": [2, 4]}) != request_hash(BODY)
    bad = client.post("/v1/plans", json=BODY | {"mesh": [3, 3]}, headers=writer)
    assert bad.status_code == 422, bad.text
    assert "mesh" in bad.text


def test_precision_is_accepted_checked_and_its_own_cache_entry(client: TestClient, writer: Headers) -> None:
    """``training.precision`` (README: FP8 training): fp8 on H100s is a request of its own; bf16, the
    default, keeps the key of a request that leaves it out; fp8 on a GPU without FP8 math and an
    unknown name are 422s naming the field."""
    h100 = copy.deepcopy(BODY)
    h100["cluster"]["gpu"] = "H100-80GB"
    fp8 = copy.deepcopy(h100)
    fp8["training"]["precision"] = "fp8"
    ok = client.post("/v1/plans", json=fp8, headers=writer)
    assert ok.status_code == 202, ok.text
    assert ok.json()["job"]["request_hash"] == request_hash(fp8) != request_hash(h100)
    bf16 = copy.deepcopy(h100)
    bf16["training"]["precision"] = "bf16"
    assert request_hash(bf16) == request_hash(h100)
    a100 = copy.deepcopy(fp8)
    a100["cluster"]["gpu"] = "A100-80GB"
    for bad_body in (a100, BODY | {"training": {**BODY["training"], "precision": "fp4"}}):
        bad = client.post("/v1/plans", json=bad_body, headers=writer)
        assert bad.status_code == 422, bad.text
        assert "precision" in bad.text

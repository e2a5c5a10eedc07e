"""``target`` in POST /v1/plans and GET /v1/plans/{id}/export: a stored plan as a trainer's files,
a 422 problem naming what the trainer cannot run, 404 for an unknown plan."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from parplan.service.models import Plan
from parplan.service.plans.service import cache_key
from parplan.solver.planner import solve
from parplan.solver.request import parse_plan_request, request_hash
from parplan.workers.celery_app import CeleryJobQueue

Headers = dict[str, str]
BODY: dict[str, Any] = {"model": {"preset": "llama-2-7b"}, "cluster": {"gpus": 8, "gpu": "A100-80GB"},
                        "training": {"global_batch": 16, "seq_len": 2048}, "objective": {"kind": "max-throughput"},
                        "target": "megatron"}


def _store(db: sessionmaker[Session], body: dict[str, Any]) -> str:
    """Solve ``body`` for real and store its plan; the plan's id."""
    rh = request_hash(body)
    with db() as s:
        plan = Plan(cache_key=cache_key(rh, None), request_hash=rh, solver_version="test",
                    calibration_source="default", request=body, document=solve(parse_plan_request(body)))
        s.add(plan)
        s.commit()
        return str(plan.id)


def test_a_target_is_part_of_the_request_and_checked(client: TestClient, writer: Headers,
                                                     queue: CeleryJobQueue) -> None:
    ok = client.post("/v1/plans", json=BODY, headers=writer)
    assert ok.status_code == 202, ok.text
    assert ok.json()["job"]["request_hash"] == request_hash(BODY) != request_hash(BODY | {"target": "any"})
    for bad, field in ((BODY | {"target": "nemo"}, "target"), (BODY | {"search": "ilp"}, "search"),
                       (BODY | {"target": "galvatron", "mesh": [2, 4]}, "mesh")):
        r = client.post("/v1/plans", json=bad, headers=writer)
        assert r.status_code == 422, r.text
        assert r.headers["content-type"] == "application/problem+json" and field in r.text


def test_a_stored_plan_is_exported_for_its_target(client: TestClient, reader: Headers,
                                                  db: sessionmaker[Session]) -> None:
    plan_id = _store(db, BODY)
    r = client.get(f"/v1/plans/{plan_id}/export", params={"target": "megatron"}, headers=reader)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["target"] == "megatron" and out["version"] == "core_v0.16.1"
    assert set(out["files"]) == {"megatron_args.txt", "launch_megatron.sh"} and len(out["launch"]) == 1
    plan = client.get(f"/v1/plans/{plan_id}", headers=reader).json()
    assert f"--tensor-model-parallel-size {plan['strategy']['tp']}" in out["files"]["megatron_args.txt"]
    assert plan["target"]["name"] == "megatron"


def test_what_a_trainer_cannot_run_is_a_422_naming_why(client: TestClient, reader: Headers,
                                                      db: sessionmaker[Session]) -> None:
    plan_id = _store(db, BODY | {"model": {"preset": "llama-2-13b"}, "cluster": {"gpus": 8, "gpu": "A100-40GB"}})
    tp = client.get(f"/v1/plans/{plan_id}", headers=reader).json()["strategy"]["tp"]
    assert tp > 1  # a 13B model on 40 GB GPUs needs tensor parallelism under Megatron-LM
    r = client.get(f"/v1/plans/{plan_id}/export", params={"target": "deepspeed"}, headers=reader)
    assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json"
    problem = r.json()
    assert "deepspeed cannot express" in problem["detail"]
    assert any("tensor parallelism" in e["message"] for e in problem["errors"])
    unknown = client.get(f"/v1/plans/{plan_id}/export", params={"target": "nemo"}, headers=reader)
    assert unknown.status_code == 422 and unknown.headers["content-type"] == "application/problem+json"
    missing = client.get(f"/v1/plans/{plan_id}/export", headers=reader)
    assert missing.status_code == 422


def test_export_of_an_unknown_plan_is_404(client: TestClient, reader: Headers) -> None:
    r = client.get("/v1/plans/00000000-0000-0000-0000-000000000000/export", params={"target": "megatron"},
                   headers=reader)
    assert r.status_code == 404 and r.headers["content-type"] == "application/problem+json"

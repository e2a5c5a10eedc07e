"""``POST /v1/capacity`` and ``POST /v1/replan`` over the real app and PostgreSQL; each cell's plan
job is run by the workers' own code (:func:`execute_job`, a real solve in a child process), then
the sweep is settled as a worker settles it. Oracles: the single-plan endpoint's answer for each
cell's request, and a brute-force scan of those single plans."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from parplan.service.models import Job, SweepCell
from parplan.service.settings import Settings
from parplan.workers.execute import execute_job
from parplan.workers.sweeps import settle_after

Headers = dict[str, str]
SF = sessionmaker[Session]
POOLS = [{"gpu": "A100-40GB", "gpus_per_node": 2, "max_gpus": 2, "price_per_gpu_hour": 1.0},
         {"gpu": "H100-80GB", "gpus_per_node": 2, "max_gpus": 2, "price_per_gpu_hour": 2.5}]
TRAINING = {"global_batch": 8, "seq_len": 512, "tokens": 1e9}


def _run_cells(db: SF, settings: Settings, sweep_id: str) -> None:
    """Run the sweep's queued cells as a worker does (solve, store, settle the sweep)."""
    with db() as s:
        ids = list(s.scalars(select(SweepCell.job_id).join(Job, Job.id == SweepCell.job_id)
                             .where(SweepCell.sweep_id == uuid.UUID(sweep_id), Job.status == "queued")))
    for job_id in ids:
        execute_job(job_id, db, settings)
        settle_after(job_id, db)


def _sweep(client: TestClient, writer: Headers, body: dict[str, Any]) -> dict[str, Any]:
    r = client.post("/v1/capacity", json=body, headers=writer)
    assert r.status_code == 202, r.text
    out: dict[str, Any] = r.json()
    assert out["result_url"] == f"/v1/capacity/{out['job']['id']}" and out["job"]["kind"] == "capacity"
    return out


def _single_plan(client: TestClient, writer: Headers, model: dict[str, Any], gpu: str, gpus: int) -> dict[str, Any]:
    body = {"model": model, "cluster": {"gpus": gpus, "gpu": gpu, "gpus_per_node": 2},
            "training": {"global_batch": 8, "seq_len": 512}, "objective": {"kind": "max-throughput"}}
    r = client.post("/v1/plans", json=body, headers=writer)
    assert r.status_code == 200, f"the cell's plan is not the single-plan endpoint's cached answer: {r.text}"
    plan: dict[str, Any] = r.json()["plan"]
    return plan


@pytest.mark.parametrize("preset", ["gpt-7.5b", "gpt-1.7b", "bert-large"])
def test_each_cell_is_the_single_plan_and_fewest_matches_a_scan(client: TestClient, writer: Headers,
                                                                reader: Headers, db: SF, settings: Settings,
                                                                preset: str) -> None:
    model = {"preset": preset}
    sub = _sweep(client, writer, {"model": model, "training": TRAINING, "pools": POOLS})
    partial = client.get(sub["result_url"], headers=reader).json()
    assert partial["complete"] is False and {c["status"] for c in partial["cells"]} == {"pending"}
    _run_cells(db, settings, sub["job"]["id"])
    job = client.get(sub["job"]["url"], headers=reader).json()["job"]
    assert job["status"] == "succeeded" and job["result_url"] == sub["result_url"], job
    doc = client.get(sub["result_url"], headers=reader).json()
    assert {c["status"] for c in doc["cells"]} == {"done"}, doc["cells"]
    assert doc["complete"] and [(c["gpu"], c["gpus"]) for c in doc["cells"]] == [
        ("A100-40GB", 1), ("A100-40GB", 2), ("H100-80GB", 1), ("H100-80GB", 2)]
    for pool in POOLS:
        fewest = None
        for gpus in (1, 2):  # brute force: every allocation, smallest first, each a single plan
            plan = _single_plan(client, writer, model, pool["gpu"], gpus)
            cell = next(c for c in doc["cells"] if c["gpu"] == pool["gpu"] and c["gpus"] == gpus)
            assert cell["plan_id"] == plan["id"]
            fits = bool(plan["memory"] and plan["memory"]["fits"])
            assert cell["fits"] is fits
            if fits:
                assert cell["tokens_per_second"] == pytest.approx(plan["time"]["tokens_per_second"])
                assert cell["time_to_train_hours"] == pytest.approx(1e9 / plan["time"]["tokens_per_second"] / 3600)
                fewest = gpus if fewest is None else fewest
        assert doc["fewest_gpus_that_fit"][pool["gpu"]] == fewest


def test_bad_input_names_the_field(client: TestClient, writer: Headers) -> None:
    base = {"model": {"preset": "gpt-1.7b"}, "training": TRAINING, "pools": POOLS}
    for pool, field in (({**POOLS[0], "gpu": "Z900"}, "pools.0.gpu"),
                        ({**POOLS[0], "price_per_gpu_hour": 0}, "pools.0.price_per_gpu_hour")):
        r = client.post("/v1/capacity", json={**base, "pools": [pool]}, headers=writer)
        assert r.status_code == 422 and r.headers["content-type"].startswith("application/problem+json")
        assert field in [e["field"] for e in r.json()["errors"]], r.text
    r = client.post("/v1/replan", json={"plan_id": str(uuid.uuid4()), "nodes_lost": 1}, headers=writer)
    assert r.status_code == 422 and r.json()["errors"][0]["field"] == "plan_id"


def test_a_replan_to_more_gpus_than_a_request_may_name_is_a_422(client: TestClient, writer: Headers,
                                                                db: SF, settings: Settings) -> None:
    """Schemathesis's case: an existing plan replanned on 116,466,169 GPUs (more than a plan request
    may name) is a 422 naming ``gpus``, not a 500."""
    plan_body = {"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": 8, "gpu": "A100-80GB"},
                 "training": {"global_batch": 16}}
    r = client.post("/v1/plans", json=plan_body, headers=writer)
    execute_job(uuid.UUID(r.json()["job"]["id"]), db, settings)
    plan_id = client.get(r.json()["job"]["url"], headers=writer).json()["job"]["plan_id"]
    r = client.post("/v1/replan", json={"plan_id": plan_id, "gpus": 116466169.0}, headers=writer)
    assert r.status_code == 422 and r.headers["content-type"].startswith("application/problem+json"), r.text
    assert r.json()["errors"][0]["field"] == "gpus"


def test_a_deadline_no_allocation_meets_is_said_and_cancel_ends_the_cells(
        client: TestClient, writer: Headers, reader: Headers, db: SF, settings: Settings) -> None:
    body = {"model": {"preset": "bert-large"}, "training": {**TRAINING, "tokens": 1e15},
            "pools": POOLS[1:], "goal": {"deadline_hours": 1.0}}
    sub = _sweep(client, writer, body)
    _run_cells(db, settings, sub["job"]["id"])
    doc = client.get(sub["result_url"], headers=reader).json()
    assert doc["goal_met"] is False and doc["cheapest_meeting_deadline"] is None and "no allocation" in doc["note"]
    other = _sweep(client, writer, {**body, "pools": [{**POOLS[0], "max_gpus": 4}]})
    r = client.post(f"{other['job']['url']}/cancel", headers=writer)
    assert r.status_code == 200 and r.json()["job"]["status"] == "cancelled"
    cells = client.get(other["result_url"], headers=reader).json()["cells"]
    assert {c["status"] for c in cells} == {"cancelled"}


def test_replan_of_llama3_70b_after_losing_a_node(client: TestClient, writer: Headers, reader: Headers,
                                                  db: SF, settings: Settings) -> None:
    """64 H100s, Megatron-LM, 112 samples a step. After one node is lost: a plan on 56 GPUs; the
    distributed checkpoint (fully reshardable optimizer) resumes into it, the DP-only optimizer
    format does not when TP or PP changed. With 128 samples no plan on 56 exists (56 = 7 x 8, and 7
    divides none of the 64 heads, 80 layers and 128 samples TP, PP and DP split): the replan says so."""
    for batch in (112, 128):
        plan_body = {"model": {"preset": "llama-3-70b"}, "cluster": {"gpus": 64, "gpu": "H100-80GB"},
                     "training": {"global_batch": batch, "seq_len": 8192}, "objective": {"kind": "max-throughput"},
                     "target": "megatron"}
        r = client.post("/v1/plans", json=plan_body, headers=writer)
        execute_job(uuid.UUID(r.json()["job"]["id"]), db, settings)
        plan_id = client.get(r.json()["job"]["url"], headers=reader).json()["job"]["plan_id"]
        docs = []
        for reshardable in (True, False):
            r = client.post("/v1/replan", json={"plan_id": plan_id, "nodes_lost": 1,
                                                "reshardable_optimizer": reshardable}, headers=writer)
            assert r.status_code == 202, r.text
            _run_cells(db, settings, r.json()["job"]["id"])
            docs.append(client.get(r.json()["result_url"], headers=reader).json())
        full, dp_only = docs
        assert full["gpus"] == 56 and full["gpus_before"] == 64 and full["status"] == "succeeded"
        if batch == 128:
            assert full["resumable"] is False and "no plan on 56 H100-80GB fits" in full["reasons"][0]
            continue
        assert full["resumable"] is True and full["reasons"] == [] and full["fits"] is True
        new = client.get(f"/v1/plans/{full['plan_id']}", headers=reader).json()
        assert new["cluster"]["gpus"] == 56
        assert full["switch_cost"]["lost_steps"] == 500 and full["switch_cost"]["save_seconds"] == 0
        changed = set(full["changes"])
        assert changed, "64 -> 56 GPUs changes some parallel degree"
        degrees = {a: full["changes"].get(a, {"after": [new["strategy"][k]]})["after"][0]
                   for a, k in (("tp", "tp"), ("pp", "pp"), ("dp", "dp"), ("cp", "cp"))}
        assert degrees["tp"] * degrees["pp"] * degrees["dp"] * degrees["cp"] == 56, degrees
        assert dp_only["resumable"] is (not changed & {"tp", "pp", "cp", "ep"})

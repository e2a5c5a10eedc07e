"""A capacity sweep in the Celery layout (real PostgreSQL, Redis, server and two workers): a worker
killed with SIGKILL mid-sweep loses no cell and finishes none twice; cancelling a sweep cancels
its cells. One test, so the processes start once."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from typing import Any

import httpx
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from parplan.service.auth.service import Scope
from parplan.service.models import Job, JobEvent, Plan, SweepCell
from tests.support.service import (
    Proc,
    finished,
    make_token,
    poll_job,
    service_env,
    settings_env,
    solver_children,
    start_server,
    start_worker,
)

SF = sessionmaker[Session]


def _body(preset: str) -> dict[str, Any]:
    # Cells of a few seconds each: 1, 2, 4 and 8 GPUs of one pool.
    return {"model": {"preset": preset}, "training": {"global_batch": 8, "seq_len": 1024, "tokens": 1e9},
            "pools": [{"gpu": "H100-80GB", "gpus_per_node": 8, "max_gpus": 8, "price_per_gpu_hour": 2.0}]}


def _cells(sf: SF, sweep_id: str) -> list[Job]:
    with sf() as s:
        return list(s.scalars(select(Job).join(SweepCell, SweepCell.job_id == Job.id)
                              .where(SweepCell.sweep_id == uuid.UUID(sweep_id)).order_by(SweepCell.idx)))


def _wait(what: str, check: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (got := check()):
        assert time.monotonic() < deadline, what
        time.sleep(0.02)
    return got


def test_a_killed_worker_loses_no_cell_and_cancel_ends_the_cells(pg_url: str, redis_url: str, queue_name: str,
                                                                  procs: list[Proc], committed_db: SF) -> None:
    env = service_env(settings_env(pg_url, redis_url, queue_name, job_lease_seconds=5))
    server, base = start_server(env)
    procs.append(server)
    victim, other = start_worker(env), start_worker(env)
    procs += [victim, other]
    token = make_token(committed_db, Scope.PLANS_WRITE)
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=10) as c:
        sub = c.post("/v1/capacity", json=_body("gpt-7.5b")).json()
        sweep_id = sub["job"]["id"]
        # SIGKILL one worker (its process group) while it holds a cell and its solver runs.
        child = _wait("the victim never ran a solve", lambda: solver_children(victim.pid))[0]
        pool_pid = _parent(child)  # the victim's pool process, named in the job it claimed
        held = _wait("no cell names the victim", lambda: [j for j in _cells(committed_db, sweep_id)
                                                          if j.status == "running" and j.worker
                                                          and j.worker.endswith(f":{pool_pid}")])
        victim.kill()
        procs.append(start_worker(env))
        job = poll_job(c, sub["job"]["url"], finished, timeout=180)
        assert job["status"] == "succeeded" and job["result_url"] == sub["result_url"], job
        doc = c.get(sub["result_url"]).json()
        cells = _cells(committed_db, sweep_id)
        assert doc["complete"] and [x["status"] for x in doc["cells"]] == ["done"] * 4
        assert all(j.status == "succeeded" and j.plan_id is not None for j in cells)
        with committed_db() as s:
            ids = [j.id for j in cells]
            # Finished once each: one "succeeded" event per cell job, one plan per cell.
            done = s.scalars(select(func.count()).select_from(JobEvent)
                             .where(JobEvent.job_id.in_(ids), JobEvent.status == "succeeded")).one()
            plans = s.scalars(select(func.count()).select_from(Plan)).one()
            # The sweep's own events count the cells answered, in order, then its end.
            stages = [d["progress"]["stage"] for d in s.scalars(select(JobEvent.document).where(
                JobEvent.job_id == uuid.UUID(sweep_id)).order_by(JobEvent.id))]
        assert done == 4 and plans == 4
        counted = [int(x.split("/")[0]) for x in stages[:-1]]
        assert stages[0] == "0/4 cells" and stages[-1] == "done" and counted == sorted(set(counted)), stages
        assert len(counted) >= 2, stages
        assert max(j.attempts for j in cells) <= 2
        again = next(j for j in cells if j.id == held[0].id)  # the victim's cell ran again, elsewhere
        assert again.attempts == 2 and not (again.worker or "").endswith(f":{pool_pid}")

        # The CLI prints the API's document (the same sweep again: every cell cached, a new sweep id).
        out = subprocess.run([sys.executable, "-m", "parplan.cli", "capacity", "--model", "gpt-7.5b", "--pool",
                              "H100-80GB:8:8:2.0", "--tokens", "1e9", "--global-batch", "8", "--seq-len", "1024",
                              "--json"], env={**env, "PARPLAN_URL": base, "PARPLAN_TOKEN": token},
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        cli = json.loads(out.stdout)
        assert cli["id"] != doc["id"] and {**cli, "id": doc["id"]} == doc

        # Cancel a second sweep while its cells run: every cell ends cancelled, none runs on.
        sub = c.post("/v1/capacity", json=_body("gpt-3.6b")).json()
        _wait("no cell started", lambda: any(j.status == "running" for j in _cells(committed_db, sub["job"]["id"])))
        queued = {j.id for j in _cells(committed_db, sub["job"]["id"]) if j.status == "queued"}
        r = c.post(f"{sub['job']['url']}/cancel")
        assert r.status_code == 200 and r.json()["job"]["status"] == "cancelled", r.text
        _wait("cells still running after the cancel",
              lambda: all(finished({"status": j.status}) for j in _cells(committed_db, sub["job"]["id"])), 30)
        after = {j.id: j.status for j in _cells(committed_db, sub["job"]["id"])}
        assert all(after[i] == "cancelled" for i in queued) and "cancelled" in after.values(), after
        assert set(after.values()) <= {"cancelled", "succeeded"}, after  # running at the cancel: stopped or done


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])

"""Capacity sweeps and replans: validate, fan out one plan request per cell (each cached, joined
or queued exactly as ``POST /v1/plans`` does it), follow the cells, and read the result. Never
solves anything: the cells are plan jobs the workers run.

A sweep's job has no worker and no lease: it is ``running`` from its creation and ends when its
last cell has (:func:`settle`, called by the worker that finished a cell, by the sweeper, and at
submission when every cell was cached). Its progress counts the cells answered, one event each.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from parplan.service.capacity.repository import CellRow, SweepRepository
from parplan.service.capacity.schemas import CapacityIn, ReplanIn
from parplan.service.capacity.settle import settle
from parplan.service.database import utcnow
from parplan.service.deps import UnitOfWork
from parplan.service.jobs.repository import JobRepository
from parplan.service.models import Job, JobStatus, Sweep, SweepCell
from parplan.service.overload import admit_new_job
from parplan.service.plans import service as plans
from parplan.service.problems import InvalidError, ProblemError, field_error
from parplan.service.queue import JobQueue
from parplan.service.settings import Settings
from parplan.solver.capacity import CapacityError, CellOutcome, Goal, Pool, gpu_counts
from parplan.solver.cluster import gpu_preset
from parplan.solver.replan import new_gpu_count
from parplan.solver.request import PlanRequestIn

#: Most cells one sweep may have.
MAX_CELLS = 512


@dataclass(frozen=True)
class CellRequest:
    gpu: str
    gpus: int
    validated: plans.Validated


@dataclass(frozen=True)
class Prepared:
    """A sweep that passed validation: its kind, the stored request, and its cells' plan requests."""

    kind: str
    request: dict[str, Any]
    cells: tuple[CellRequest, ...]


def _invalid(loc: Sequence[str | int], message: str) -> InvalidError:
    err = field_error(["body", *loc], message)
    return InvalidError(f"{err['field']}: {message}", [err])


def _cell(body: dict[str, Any], loc: Sequence[str | int], settings: Settings) -> plans.Validated:
    """One cell's plan request validated as ``POST /v1/plans`` does; a failure names ``loc``."""
    try:
        return plans.validate(PlanRequestIn.model_validate(body), settings)
    except ValidationError as e:  # the cell's body breaks a bound of the plan request (GPUs, batch)
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise _invalid(loc, f"{body['cluster']['gpus']} GPUs: {where}: {first['msg']}") from None
    except ProblemError as e:
        errors = e.extra.get("errors") or []
        reason = errors[0]["message"] if errors else e.detail
        raise _invalid(loc, f"{body['cluster']['gpus']} GPUs: {reason}") from None


def prepare_capacity(payload: CapacityIn, settings: Settings) -> Prepared:
    """Every cell's plan request, validated (422 naming the pool's field on a failure)."""
    pools: list[dict[str, Any]] = []
    cells: list[CellRequest] = []
    training = payload.training.model_dump(exclude_none=True, exclude={"tokens"})
    for i, p in enumerate(payload.pools):
        if p.max_gpus > settings.max_devices:
            raise _invalid(["pools", i, "max_gpus"], f"must be <= {settings.max_devices} on this service")
        first = _cell(_cell_body(payload, training, p.gpu, p.gpus_per_node, 1), ["pools", i, "gpu"], settings)
        gpu = first.request.cluster.gpu.name
        if any(q["gpu"] == gpu for q in pools):
            raise _invalid(["pools", i, "gpu"], f"{gpu} is in an earlier pool; each GPU type appears in one pool")
        per_node = p.gpus_per_node or gpu_preset(gpu).default_gpus_per_node
        try:
            counts = gpu_counts(per_node, p.max_gpus)
        except CapacityError as e:
            raise _invalid(["pools", i, e.field], str(e)) from None
        if len(cells) + len(counts) > MAX_CELLS:
            raise _invalid(["pools", i, "max_gpus"], f"the sweep would have more than {MAX_CELLS} cells")
        pools.append({"gpu": gpu, "gpus_per_node": per_node, "max_gpus": p.max_gpus,
                      "price_per_gpu_hour": p.price_per_gpu_hour})
        for n in counts:
            v = _cell(_cell_body(payload, training, gpu, per_node, n), ["pools", i, "max_gpus"], settings)
            cells.append(CellRequest(gpu, n, v))
    request = {"model": payload.model.to_body(), "training": payload.training.model_dump(exclude_none=True),
               "target": payload.target, "objective": payload.objective, "search": payload.search,
               "pools": pools, "goal": payload.goal.model_dump(exclude_none=True) if payload.goal else None}
    return Prepared("capacity", request, tuple(cells))


def prepare_replan(payload: ReplanIn, session: Session, settings: Settings) -> Prepared:
    """The replan's one cell: the plan's own request on the new allocation, the batch kept."""
    try:
        found = SweepRepository(session).plan_document(uuid.UUID(payload.plan_id))
    except ValueError:
        found = None
    if found is None:
        raise _invalid(["plan_id"], f"no plan {payload.plan_id}")
    old_request, old_doc = found
    cluster = old_doc.get("cluster") or {}
    gpus, per_node = int(cluster["gpus"]), int(cluster["gpus_per_node"])
    where = "gpus" if payload.gpus is not None else "nodes_lost"
    try:
        new = new_gpu_count(gpus, per_node, new_gpus=payload.gpus, nodes_lost=payload.nodes_lost)
    except CapacityError as e:
        raise _invalid([e.field], str(e)) from None
    training = dict(old_request.get("training") or {})
    training["global_batch"] = int(training.get("global_batch") or (old_doc.get("strategy") or {}).get("global_batch")
                                   or gpus)  # the batch the plan ran (its default was its GPU count)
    # A fixed device mesh factors the old allocation only: the search picks the new one.
    body = {**{k: v for k, v in old_request.items() if k != "mesh"},
            "cluster": {**old_request["cluster"], "gpus": new, "gpus_per_node": per_node}, "training": training}
    v = _cell(body, [where], settings)
    request = {"plan_id": payload.plan_id, "gpus_before": gpus, "gpus": new, "nodes_lost": payload.nodes_lost,
               "target": old_request.get("target", "any"), "storage_gb_per_second": payload.storage_gb_per_second,
               "checkpoint_interval_steps": payload.checkpoint_interval_steps,
               "reshardable_optimizer": payload.reshardable_optimizer}
    return Prepared("replan", request, (CellRequest(v.gpu, new, v),))


def _cell_body(payload: CapacityIn, training: dict[str, Any], gpu: str, per_node: int | None,
               gpus: int) -> dict[str, Any]:
    """One cell's plan request: what ``POST /v1/plans`` would be sent for that allocation."""
    cluster: dict[str, Any] = {"gpus": gpus, "gpu": gpu}
    if per_node is not None:
        cluster["gpus_per_node"] = per_node
    body: dict[str, Any] = {"model": payload.model.to_body(), "cluster": cluster, "training": training,
                            "objective": {"kind": payload.objective}, "target": payload.target}
    if payload.search != "auto":
        body["search"] = payload.search
    return body


def submit(prep: Prepared, calibration: Callable[[str], dict[str, Any] | None], session: Session,
           uow: UnitOfWork, queue: JobQueue, token_id: uuid.UUID | None, settings: Settings) -> Job:
    """Create the sweep's job and its cells (each served from the plan cache, joined to the same
    request in flight, or queued after the commit); settle it at once if every cell is answered."""
    admit_new_job(session, token_id, settings)
    now = utcnow()
    text = json.dumps({"kind": prep.kind, "request": prep.request}, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(text.encode()).hexdigest()
    jobs = JobRepository(session)
    job = jobs.add(Job(kind=prep.kind, status=JobStatus.RUNNING.value, request=prep.request, request_hash=digest,
                       cache_key=digest, progress_stage=f"0/{len(prep.cells)} cells", progress_fraction=0.0,
                       token_id=token_id, created_at=now, updated_at=now, started_at=now, enqueued_at=now))
    cals: dict[str, dict[str, Any] | None] = {}
    rows: list[SweepCell] = []
    for idx, c in enumerate(prep.cells):
        if c.gpu not in cals:
            cals[c.gpu] = calibration(c.gpu)
        key = plans.cache_key(c.validated.request_hash, cals[c.gpu])
        joined = jobs.active_for_key(key)
        sub = plans.submit(c.validated, cals[c.gpu], session, uow, queue, token_id)
        rows.append(SweepCell(sweep_id=job.id, idx=idx, gpu=c.gpu, gpus=c.gpus, job_id=sub.job.id,
                              owned=sub.plan is None and joined is None))
    SweepRepository(session).add(Sweep(job_id=job.id, kind=prep.kind, request=prep.request, created_at=now), rows)
    settle(session, job.id)
    return jobs.refresh(job)


def cancel(session: Session, job: Job) -> None:
    """Cancel a sweep: the queued or running cells it created, then its job."""
    jobs, now = JobRepository(session), utcnow()
    for cell in SweepRepository(session).owned_active_cells(job.id):
        jobs.request_cancel(cell, now)
    jobs.close_sweep(job.id, JobStatus.CANCELLED, now,
                     {"code": "cancelled", "type": "Cancelled", "message": "cancelled by a client"})


def outcome(row: CellRow) -> CellOutcome:
    """A cell as the solver library's summary reads it."""
    gpu, gpus = row.gpu, row.gpus
    if row.status in (JobStatus.QUEUED.value, JobStatus.RUNNING.value):
        return CellOutcome(gpu, gpus, status="pending")
    if row.status == JobStatus.SUCCEEDED.value:
        # A plan document with no memory is the solver's "infeasible": nothing fits.
        return CellOutcome(gpu, gpus, status="done", plan_id=str(row.plan_id) if row.plan_id else None,
                           fits=bool(row.fits), step_seconds=row.step_seconds, tokens_per_second=row.tokens_per_second)
    err = row.error or {}
    if err.get("code") == "unsolvable":
        return CellOutcome(gpu, gpus, status="unsolvable", fits=False, error=str(err.get("message")))
    status = "cancelled" if row.status == JobStatus.CANCELLED.value else "failed"
    return CellOutcome(gpu, gpus, status=status, error=str(err.get("message")) if err else None)


def pools_of(request: Mapping[str, Any]) -> tuple[Pool, ...]:
    return tuple(Pool(p["gpu"], int(p["gpus_per_node"]), int(p["max_gpus"]), float(p["price_per_gpu_hour"]))
                 for p in request["pools"])


def goal_of(request: Mapping[str, Any]) -> Goal:
    g = request.get("goal") or {}
    return Goal(deadline_hours=g.get("deadline_hours"), budget=g.get("budget"))

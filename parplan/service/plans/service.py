"""Plan requests: validate (the request model's schema, then its resolution's checks), look up the
cache, or create a job and enqueue it after the commit. Never solves anything."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from parplan.service.database import utcnow
from parplan.service.deps import UnitOfWork
from parplan.service.dispatch import Dispatcher
from parplan.service.jobs.repository import JobRepository
from parplan.service.models import Job, JobStatus, Plan
from parplan.service.overload import admit_new_job
from parplan.service.plans.repository import PlanRepository
from parplan.service.problems import InvalidError, TooLargeError, field_error, get_or_404
from parplan.service.profiles.repository import ProfileRepository
from parplan.service.queue import JobQueue
from parplan.service.settings import Settings
from parplan.solver.errors import GraphIssue, GraphValidationError, SolverError
from parplan.solver.request import (
    DEFAULT_TIME_LIMIT_SECONDS,
    PlanRequest,
    PlanRequestIn,
    RequestError,
    request_hash,
)


def _loc(field: str) -> list[str | int]:
    """``"cluster.gpus"`` → ``["body", "cluster", "gpus"]``; ``"inputs[0]"`` → ``["inputs", 0]``."""
    out: list[str | int] = ["body"]
    if field in ("body", "request", ""):
        return out
    for part in field.split("."):
        name, _, rest = part.partition("[")
        if name:
            out.append(name)
        while rest:
            idx, _, rest = rest.partition("]")
            out.append(int(idx) if idx.isdigit() else idx)
            rest = rest.lstrip("[")
    return out


def _graph_issue_errors(issues: list[GraphIssue], body: Mapping[str, Any]) -> list[dict[str, Any]]:
    nodes = (body.get("model") or {}).get("graph", {}).get("nodes") or []
    index = {n.get("id"): i for i, n in enumerate(nodes) if isinstance(n, Mapping)}
    errors = []
    for issue in issues:
        loc: list[str | int] = ["body", "model", "graph"]
        if issue.node is not None and issue.node in index:
            loc += ["nodes", index[issue.node]]
            loc += _loc(issue.field)[1:]
        else:
            loc += _loc(issue.field)[1:]
        err = field_error(loc, issue.message, "graph")
        err["node"] = issue.node
        errors.append(err)
    return errors


def invalid_from_solver(e: SolverError, body: Mapping[str, Any]) -> InvalidError:
    """A 422 problem naming the field (and for graphs each node) the solver rejected."""
    inner = e.__context__ if isinstance(e.__context__, GraphValidationError) else e
    if isinstance(inner, GraphValidationError):
        errors = _graph_issue_errors(inner.issues, body)
        return InvalidError(f"the model graph is invalid: {errors[0]['field']}: {errors[0]['message']}" if errors
                       else str(inner), errors)
    field = e.field if isinstance(e, RequestError) else "body"
    message = str(e)
    prefix = f"{field}: "
    return InvalidError(message, [field_error(_loc(field), message[len(prefix):] if message.startswith(prefix)
                                         else message, "request")])


@dataclass(frozen=True)
class Validated:
    """A request that passed its model's checks, resolved, with its solver hash."""

    body: dict[str, Any]
    request: PlanRequest
    request_hash: str

    @property
    def gpu(self) -> str:
        return self.request.cluster.gpu.name


def cache_key(req_hash: str, calibration: Mapping[str, Any] | None) -> str:
    """The plan cache key: the solver's request hash (which includes the solver version), plus the
    calibration the plan is solved with when there is one — a new calibration means new plans."""
    if not calibration:
        return req_hash
    cal = json.dumps(calibration, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(f"{req_hash}\n{cal}".encode()).hexdigest()


def check_limits(payload: PlanRequestIn, settings: Settings) -> None:
    if payload.cluster.gpus > settings.max_devices:
        raise InvalidError(f"cluster.gpus: {payload.cluster.gpus} devices is more than this service plans for "
                           f"({settings.max_devices}, PARPLAN_MAX_DEVICES)",
                           [field_error(["body", "cluster", "gpus"], f"must be <= {settings.max_devices}",
                                        "less_than_equal")])
    if payload.time_limit is not None and payload.time_limit > settings.max_time_limit_seconds:
        limit = settings.max_time_limit_seconds
        raise InvalidError(f"time_limit: at most {limit:g} s on this service (PARPLAN_MAX_TIME_LIMIT_SECONDS)",
                           [field_error(["body", "time_limit"], f"must be <= {limit:g}", "less_than_equal")])
    graph = payload.model.graph
    if graph is not None:
        nodes = graph.get("nodes")
        if isinstance(nodes, list) and len(nodes) > settings.max_graph_nodes:
            raise TooLargeError(f"model.graph has {len(nodes)} nodes; the limit is {settings.max_graph_nodes} "
                                "(PARPLAN_MAX_GRAPH_NODES)",
                                errors=[field_error(["body", "model", "graph", "nodes"],
                                                    f"at most {settings.max_graph_nodes} nodes", "too_large")])


def validate(payload: PlanRequestIn, settings: Settings) -> Validated:
    """The service's limits, then the solver's own validation (422 naming the field) and hash.
    CPU only: cheap for presets and HF configs; graphs cost in proportion to their size."""
    check_limits(payload, settings)
    if payload.time_limit is None and settings.max_time_limit_seconds < DEFAULT_TIME_LIMIT_SECONDS:
        payload = payload.model_copy(update={"time_limit": settings.max_time_limit_seconds})
    body = payload.to_body()
    try:
        request = payload.resolve()
        return Validated(body, request, request_hash(request))
    except SolverError as e:
        raise invalid_from_solver(e, body) from None
    except (ArithmeticError, ValueError) as e:  # numbers the solver cannot represent
        raise InvalidError(f"the request has values out of range: {e}",
                           [field_error(["body"], f"values out of range ({e})", "out_of_range")]) from None


def latest_calibration(session: Session, gpu: str) -> dict[str, Any] | None:
    return ProfileRepository(session).latest_calibration(gpu)


@dataclass(frozen=True)
class Submission:
    job: Job
    plan: Plan | None  # set when served from the cache
    cache_key: str


def submit(v: Validated, calibration: dict[str, Any] | None, session: Session, uow: UnitOfWork,
           queue: JobQueue, token_id: uuid.UUID | None, settings: Settings | None = None) -> Submission:
    """Serve from the cache, join the same request in flight, or create a job (enqueued by
    ``uow`` after its commit) if ``settings``' job limits admit one (429 / 503 otherwise)."""
    key = cache_key(v.request_hash, calibration)
    hit = PlanRepository(session).cached_with_job(key)
    if hit is not None:
        return Submission(job=hit[1], plan=hit[0], cache_key=key)
    jobs = JobRepository(session)
    active = jobs.active_for_key(key)
    if active is not None:  # the same request is already queued or running: share that job
        return Submission(job=active, plan=None, cache_key=key)
    if settings is not None:
        admit_new_job(session, token_id, settings)
    now = utcnow()
    # Behind the fair dispatcher a new job is born waiting (no ``enqueued_at``): the dispatcher only
    # needs waking, with no second transaction to mark it. Otherwise it is marked as handed over.
    dispatcher = queue if isinstance(queue, Dispatcher) else None
    job = jobs.add(Job(status=JobStatus.QUEUED.value, request=v.body, request_hash=v.request_hash,
                       cache_key=key, calibration=calibration, progress_stage="queued",
                       progress_fraction=0.0, token_id=token_id, created_at=now, updated_at=now,
                       enqueued_at=None if dispatcher is not None else now))
    job_id = job.id
    if dispatcher is not None:
        uow.after_commit(dispatcher.wake)
    else:
        uow.after_commit(lambda: queue.enqueue(job_id))
    return Submission(job=job, plan=None, cache_key=key)


def get_plan(session: Session, plan_id: str) -> Plan:
    return get_or_404(PlanRepository(session).get, plan_id, "plan")


def plan_out(plan: Plan) -> dict[str, Any]:
    return {**plan.document, "id": str(plan.id), "created_at": plan.created_at.isoformat()}

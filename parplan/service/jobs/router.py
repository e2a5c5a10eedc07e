"""``/v1/jobs``: read (optionally as a long poll), follow (Server-Sent Events), list (status filter,
cursor pagination), cancel."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from sqlalchemy.orm import Session

from parplan.service.auth.service import Principal, Scope
from parplan.service.deps import RuntimeDep, UoW, require
from parplan.service.jobs import service
from parplan.service.jobs.schemas import JobEnvelope, JobPage, job_out
from parplan.service.jobs.watch import MAX_WAIT_SECONDS, job_events, parse_last_event_id, wait_for_change
from parplan.service.models import JobStatus
from parplan.service.pagination import DEFAULT_LIMIT, MAX_LIMIT, CursorParam
from parplan.service.problems import PROBLEM_JSON, InvalidError, field_error, parse_id

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
_PROBLEM = {"content": {PROBLEM_JSON: {}}, "description": "RFC 9457 problem"}


@router.get("", response_model=JobPage, responses={422: _PROBLEM})
async def list_jobs(uow: UoW, _: Annotated[Principal, require(Scope.PLANS_READ)],
              status: Annotated[list[JobStatus] | None, Query(description="Repeat to match several.")] = None,
              cursor: CursorParam = None,
              limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT) -> JSONResponse:
    """Jobs, newest first. Each carries ``request_summary`` (model, GPUs, objective, target, search,
    solve seconds, and ``cached``: finished with a plan it did not solve itself)."""
    def work(session: Session) -> dict[str, Any]:
        rows, nxt = service.list_jobs(session, status, cursor, limit)
        summaries = service.request_summaries(session, rows)
        return {"jobs": [job_out(j) | {"request_summary": summaries.get(j.id)} for j in rows], "next_cursor": nxt}
    return JSONResponse(await uow.run(work, read_only=True))


@router.get("/{job_id}", response_model=JobEnvelope, responses={404: _PROBLEM, 422: _PROBLEM})
async def read_job(job_id: str, uow: UoW, rt: RuntimeDep, _: Annotated[Principal, require(Scope.PLANS_READ)],
                   wait: Annotated[float | None, Query(
                       ge=0, le=MAX_WAIT_SECONDS,
                       description="Long poll: answer as soon as the job's status or progress changes, or after "
                                   "this many seconds (at most 60, or the service's PARPLAN_MAX_JOB_WAIT_SECONDS), "
                                   "or at once when it is finished.")] = None,
                   ) -> JSONResponse:
    """Status, progress (stage and fraction), timestamps, error and plan id of a job."""
    limit = rt.settings.max_job_wait_seconds
    if wait is not None and wait > limit:
        raise InvalidError(f"wait: at most {limit:g} on this service (PARPLAN_MAX_JOB_WAIT_SECONDS)",
                           [field_error(["query", "wait"], f"must be <= {limit:g}", "less_than_equal")])
    job = await uow.run(lambda s: job_out(service.get_job(s, job_id)), read_only=True)
    if wait:
        job = await wait_for_change(rt.session_factory, parse_id(job_id, "job"), job, wait)
    return JSONResponse({"job": job})


@router.get("/{job_id}/events", responses={200: {"content": {"text/event-stream": {}},
                                                 "description": "Server-Sent Events until the job ends"},
                                           404: _PROBLEM})
async def job_events_stream(job_id: str, request: Request, uow: UoW, rt: RuntimeDep,
                            _: Annotated[Principal, require(Scope.PLANS_READ)],
                            last_event_id: Annotated[str | None, Header(
                                description="Reconnecting: the id of the last event received; the stream "
                                            "resumes after it (a value that is not an integer is ignored).")] = None,
                            ) -> StreamingResponse:
    """The job as Server-Sent Events: ``status`` (now, and at every status change), ``progress``
    (stage, fraction or the cancel flag changed), each with the job document as data, then ``end``
    with ``{"status", "plan_id", "error", "job"}``; the stream closes after ``end``. Each event has
    an ``id`` that orders the job's history; with ``Last-Event-ID`` the stream replays every event
    after that id first."""
    first = await uow.run(lambda s: job_out(service.get_job(s, job_id)), read_only=True)
    stream = job_events(rt.session_factory, parse_id(job_id, "job"), first, request.is_disconnected,
                        parse_last_event_id(last_event_id))
    return StreamingResponse(stream, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@router.post("/{job_id}/cancel", response_model=JobEnvelope,
             responses={202: {"description": "Running: the worker stops it shortly"}, 404: _PROBLEM, 409: _PROBLEM})
async def cancel_job(job_id: str, uow: UoW, _: Annotated[Principal, require(Scope.PLANS_WRITE)]) -> JSONResponse:
    """Cancel a queued job (200, now ``cancelled``) or a running one (202, ``cancel_requested``)."""
    job = await uow.run(lambda s: job_out(service.cancel_job(s, job_id)))
    return JSONResponse({"job": job}, status_code=200 if job["status"] == JobStatus.CANCELLED else 202)

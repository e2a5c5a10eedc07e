"""``/v1/jobs``: read, list (status filter, cursor pagination), cancel."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session

from parplan.service.auth.service import Principal, Scope
from parplan.service.deps import UoW, require
from parplan.service.jobs import service
from parplan.service.jobs.schemas import JobEnvelope, JobPage, job_out
from parplan.service.models import JobStatus
from parplan.service.pagination import DEFAULT_LIMIT, MAX_LIMIT, CursorParam
from parplan.service.problems import PROBLEM_JSON

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
_PROBLEM = {"content": {PROBLEM_JSON: {}}, "description": "RFC 9457 problem"}


@router.get("", response_model=JobPage, responses={422: _PROBLEM})
async def list_jobs(uow: UoW, _: Annotated[Principal, require(Scope.PLANS_READ)],
              status: Annotated[list[JobStatus] | None, Query(description="Repeat to match several.")] = None,
              cursor: CursorParam = None,
              limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT) -> JSONResponse:
    """Jobs, newest first."""
    def work(session: Session) -> dict[str, Any]:
        rows, nxt = service.list_jobs(session, status, cursor, limit)
        return {"jobs": [job_out(j) for j in rows], "next_cursor": nxt}
    return JSONResponse(await uow.run(work, read_only=True))


@router.get("/{job_id}", response_model=JobEnvelope, responses={404: _PROBLEM})
async def read_job(job_id: str, uow: UoW, _: Annotated[Principal, require(Scope.PLANS_READ)]) -> JSONResponse:
    """Status, progress (stage and fraction), timestamps, error and plan id of a job."""
    return JSONResponse({"job": await uow.run(lambda s: job_out(service.get_job(s, job_id)), read_only=True)})


@router.post("/{job_id}/cancel", response_model=JobEnvelope,
             responses={202: {"description": "Running: the worker stops it shortly"}, 404: _PROBLEM, 409: _PROBLEM})
async def cancel_job(job_id: str, uow: UoW, _: Annotated[Principal, require(Scope.PLANS_WRITE)]) -> JSONResponse:
    """Cancel a queued job (200, now ``cancelled``) or a running one (202, ``cancel_requested``)."""
    job = await uow.run(lambda s: job_out(service.cancel_job(s, job_id)))
    return JSONResponse({"job": job}, status_code=200 if job["status"] == JobStatus.CANCELLED else 202)

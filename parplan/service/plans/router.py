"""``POST /v1/plans``, ``GET /v1/plans/{id}`` and ``GET /v1/plans/{id}/export``."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Query
from fastapi.responses import JSONResponse, Response
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from parplan.service.auth.service import Principal, Scope
from parplan.service.deps import RuntimeDep, UoW, require
from parplan.service.jobs.schemas import job_out
from parplan.service.plans import service
from parplan.service.plans.schemas import ExportOut, PlanOut, PlanSubmitted
from parplan.service.problems import PROBLEM_JSON, InvalidError, field_error
from parplan.solver.request import PlanRequestIn

router = APIRouter(prefix="/v1/plans", tags=["plans"])

_PROBLEM = {"content": {PROBLEM_JSON: {}}, "description": "RFC 9457 problem"}


@router.post("", status_code=202, response_model=PlanSubmitted,
             responses={200: {"model": PlanSubmitted, "description": "Served from the plan cache"},
                        202: {"description": "Queued; poll the job at the Location header"},
                        400: _PROBLEM, 401: _PROBLEM, 403: _PROBLEM, 413: _PROBLEM, 422: _PROBLEM})
async def create_plan(payload: Annotated[PlanRequestIn, Body()], uow: UoW, rt: RuntimeDep,
                      principal: Annotated[Principal, require(Scope.PLANS_WRITE)]) -> Response:
    """Submit a plan request. Answers 200 with the plan when the same canonical request (same
    solver version and calibration) was solved before, else 202 with the job."""
    if payload.model.graph is None:  # presets and HF configs validate in microseconds
        v = service.validate(payload, rt.settings)
    else:
        v = await run_in_threadpool(service.validate, payload, rt.settings)
    known, calibration = rt.calibrations.peek(v.gpu)
    if known:  # the hot path: a plan solved before is answered from memory
        cached = rt.plan_responses.get(service.cache_key(v.request_hash, calibration))
        if cached is not None:
            return Response(cached, status_code=200, media_type="application/json")

    def work(session: Session) -> tuple[str, dict[str, Any], dict[str, Any] | None]:
        cal = calibration if known else rt.calibrations.get_or_load(
            v.gpu, lambda: service.latest_calibration(session, v.gpu))
        sub = service.submit(v, cal, session, uow, rt.queue, principal.token_id, rt.settings)
        return sub.cache_key, job_out(sub.job), service.plan_out(sub.plan) if sub.plan is not None else None

    key, job, plan = await uow.run(work)
    if plan is not None:
        body = json.dumps({"job": job, "plan": plan, "cached": True}, separators=(",", ":")).encode()
        rt.plan_responses.put(key, body)
        return Response(body, status_code=200, media_type="application/json")
    return JSONResponse({"job": job, "plan": None, "cached": False}, status_code=202,
                        headers={"Location": job["url"]})


@router.get("/{plan_id}", response_model=PlanOut, responses={404: _PROBLEM})
async def read_plan(plan_id: str, uow: UoW, _: Annotated[Principal, require(Scope.PLANS_READ)]) -> JSONResponse:
    """The plan document: the keys of ``parplan plan --json`` plus ``id`` and ``created_at``."""
    return JSONResponse(await uow.run(lambda s: service.plan_out(service.get_plan(s, plan_id)), read_only=True))


@router.get("/{plan_id}/export", response_model=ExportOut, responses={404: _PROBLEM, 422: _PROBLEM})
async def export_plan(plan_id: str, uow: UoW, _: Annotated[Principal, require(Scope.PLANS_READ)],
                      target: Annotated[Literal["megatron", "torchtitan", "deepspeed", "galvatron", "nanotron",
                                                      "parplan"],
                                        Query(description="The trainer to write the plan for.")]) -> JSONResponse:
    """The plan as the target trainer's files and launch lines, for the version in ``version``.
    422 when the trainer cannot run the plan, with every reason in ``errors``."""
    from parplan.exports import NotExpressibleError, export_plan

    document = await uow.run(lambda s: service.get_plan(s, plan_id).document, read_only=True)
    try:
        exported = await run_in_threadpool(export_plan, document, target)
    except NotExpressibleError as e:
        raise InvalidError(str(e), [field_error(["query", "target"], reason, "not_expressible")
                                    for reason in e.reasons]) from None
    return JSONResponse(exported.to_dict())

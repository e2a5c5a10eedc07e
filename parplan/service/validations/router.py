"""Validations: ``POST /v1/plans/{id}/validations`` queues one; agents claim (long poll) and
post results."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import Annotated

from fastapi import APIRouter, Body, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from parplan.service.auth.service import Principal, Scope
from parplan.service.deps import RuntimeDep, UoW, require
from parplan.service.problems import PROBLEM_JSON, InvalidError, field_error
from parplan.service.validations import service
from parplan.service.validations.schemas import (
    ClaimedEnvelope,
    ClaimIn,
    ResultIn,
    ValidationCreate,
    ValidationEnvelope,
    validation_out,
)

router = APIRouter(tags=["validations"])
_PROBLEM = {"content": {PROBLEM_JSON: {}}, "description": "RFC 9457 problem"}
#: How often a long poll looks at the database for validations queued by other processes.
POLL_SECONDS = 0.5


@router.post("/v1/plans/{plan_id}/validations", status_code=202, response_model=ValidationEnvelope,
             responses={404: _PROBLEM, 422: _PROBLEM})
async def create_validation(plan_id: str, uow: UoW, rt: RuntimeDep,
                            _: Annotated[Principal, require(Scope.PLANS_WRITE)],
                            payload: Annotated[ValidationCreate | None, Body()] = None) -> JSONResponse:
    """Queue a run of the plan on real hardware by an agent."""
    uow.after_commit(rt.wakeup.notify)
    out = await uow.run(lambda s: validation_out(service.create(s, plan_id, payload.shrink if payload else None)))
    return JSONResponse({"validation": out}, status_code=202, headers={"Location": out["url"]})


# ``:uuid``: /v1/validations/claim is not a validation (a GET there is 405, not 404).
@router.get("/v1/validations/{validation_id:uuid}", response_model=ValidationEnvelope, responses={404: _PROBLEM})
async def read_validation(validation_id: uuid.UUID, uow: UoW,
                          _: Annotated[Principal, require(Scope.PLANS_READ, Scope.AGENT)]) -> JSONResponse:
    out = await uow.run(lambda s: validation_out(service.get(s, str(validation_id))), read_only=True)
    return JSONResponse({"validation": out})


@router.post("/v1/validations/claim", response_model=ClaimedEnvelope,
             responses={204: {"description": "Nothing to validate within wait_seconds"}, 403: _PROBLEM,
                        404: _PROBLEM})
async def claim_validation(payload: ClaimIn, request: Request, rt: RuntimeDep,
                           principal: Annotated[Principal, require(Scope.AGENT)]) -> Response:
    """Take the oldest queued validation (scope ``agent``), waiting up to ``wait_seconds`` for one.
    The wait holds no database connection and no thread."""
    limit = rt.settings.max_claim_wait_seconds
    if payload.wait_seconds > limit:
        raise InvalidError(f"wait_seconds: at most {limit:g} on this service (PARPLAN_MAX_CLAIM_WAIT_SECONDS)",
                           [field_error(["body", "wait_seconds"], f"must be <= {limit:g}", "less_than_equal")])
    deadline = time.monotonic() + payload.wait_seconds
    event = rt.wakeup.bind()
    first = True
    while True:
        event.clear()

        def attempt(beat: bool = first) -> dict[str, object] | None:
            with rt.session_factory() as s:
                try:
                    out = service.claim_once(s, payload.agent_id, principal, beat=beat)
                    s.commit()
                    return out
                except BaseException:
                    s.rollback()
                    raise

        found = await run_in_threadpool(attempt)
        first = False
        if found is not None:
            return JSONResponse({"validation": found})
        left = deadline - time.monotonic()
        if left <= 0 or await request.is_disconnected():
            return Response(status_code=204)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout=min(left, POLL_SECONDS))


@router.post("/v1/validations/{validation_id}/result", response_model=ValidationEnvelope,
             responses={403: _PROBLEM, 404: _PROBLEM, 409: _PROBLEM, 422: _PROBLEM})
async def post_result(validation_id: str, payload: ResultIn, uow: UoW,
                      principal: Annotated[Principal, require(Scope.AGENT)]) -> JSONResponse:
    """The agent's measurement (scope ``agent``); stored on the validation and as profiling data."""
    out = await uow.run(lambda s: validation_out(service.record_result(s, validation_id, payload, principal)))
    return JSONResponse({"validation": out})


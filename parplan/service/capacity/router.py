"""``POST /v1/capacity`` and ``POST /v1/replan`` (jobs), and their result documents."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body
from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from parplan.service.auth.service import Principal, Scope
from parplan.service.capacity import results, service
from parplan.service.capacity.schemas import CapacityIn, CapacityOut, ReplanIn, SweepSubmitted
from parplan.service.deps import RuntimeDep, UoW, require
from parplan.service.jobs.schemas import job_out
from parplan.service.plans import service as plans
from parplan.service.problems import PROBLEM_JSON
from parplan.service.runtime import Runtime

router = APIRouter(prefix="/v1", tags=["capacity"])
_PROBLEM = {"content": {PROBLEM_JSON: {}}, "description": "RFC 9457 problem"}
_ERRORS: dict[int | str, dict[str, Any]] = {401: _PROBLEM, 403: _PROBLEM, 422: _PROBLEM, 429: _PROBLEM}


def _submit(prep: service.Prepared, rt: Runtime, principal: Principal, uow: Any) -> Any:
    def work(session: Session) -> dict[str, Any]:
        def calibration(gpu: str) -> dict[str, Any] | None:
            return rt.calibrations.get_or_load(gpu, lambda: plans.latest_calibration(session, gpu))
        return job_out(service.submit(prep, calibration, session, uow, rt.queue, principal.token_id, rt.settings))
    return work


def _accepted(job: dict[str, Any], kind: str) -> JSONResponse:
    return JSONResponse({"job": job, "result_url": f"/v1/{kind}/{job['id']}"}, status_code=202,
                        headers={"Location": job["url"]})


@router.post("/capacity", status_code=202, response_model=SweepSubmitted, responses=_ERRORS)
async def create_capacity(payload: Annotated[CapacityIn, Body()], uow: UoW, rt: RuntimeDep,
                          principal: Annotated[Principal, require(Scope.PLANS_WRITE)]) -> JSONResponse:
    """Plan the training job on every pool and GPU count (docs/capacity.md). 202 with the sweep's
    job (its progress counts the cells answered) and ``result_url``, readable while it runs."""
    prep = await run_in_threadpool(service.prepare_capacity, payload, rt.settings)
    return _accepted(await uow.run(_submit(prep, rt, principal, uow)), "capacity")


@router.get("/capacity/{sweep_id}", response_model=CapacityOut, responses={404: _PROBLEM})
async def read_capacity(sweep_id: str, uow: UoW,
                        _: Annotated[Principal, require(Scope.PLANS_READ)]) -> JSONResponse:
    """The capacity result: every cell answered so far, and what follows from them."""
    return JSONResponse(await uow.run(lambda s: results.capacity_document(s, sweep_id), read_only=True))


@router.post("/replan", status_code=202, response_model=SweepSubmitted, responses=_ERRORS)
async def create_replan(payload: Annotated[ReplanIn, Body()], uow: UoW, rt: RuntimeDep,
                        principal: Annotated[Principal, require(Scope.PLANS_WRITE)]) -> JSONResponse:
    """The best plan on the new allocation, checked against what the plan's trainer can resume
    into, with the switch's cost. 202 with the job and ``result_url``."""
    def work(session: Session) -> dict[str, Any]:
        prep = service.prepare_replan(payload, session, rt.settings)
        return _submit(prep, rt, principal, uow)(session)  # type: ignore[no-any-return]
    return _accepted(await uow.run(work), "replan")


@router.get("/replan/{sweep_id}", responses={404: _PROBLEM})
async def read_replan(sweep_id: str, uow: UoW, _: Annotated[Principal, require(Scope.PLANS_READ)]) -> JSONResponse:
    """The replan result: the new plan, ``resumable`` and its ``reasons``, the ``switch_cost``."""
    return JSONResponse(await uow.run(lambda s: results.replan_document(s, sweep_id), read_only=True))

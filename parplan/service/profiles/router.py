"""``/v1/profiles``: profiling data from agents (microbenchmarks, validations)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session

from parplan.service.auth.service import Principal, Scope
from parplan.service.deps import RuntimeDep, UoW, require
from parplan.service.pagination import DEFAULT_LIMIT, MAX_LIMIT, CursorParam
from parplan.service.problems import PROBLEM_JSON
from parplan.service.profiles import service
from parplan.service.profiles.repository import ProfileRepository
from parplan.service.profiles.schemas import ProfileEnvelope, ProfileIn, ProfilePage, profile_out

router = APIRouter(prefix="/v1/profiles", tags=["profiles"])
_PROBLEM = {"content": {PROBLEM_JSON: {}}, "description": "RFC 9457 problem"}


@router.post("", status_code=201, response_model=ProfileEnvelope, responses={422: _PROBLEM})
async def create_profile(payload: ProfileIn, uow: UoW, rt: RuntimeDep,
                         principal: Annotated[Principal, require(Scope.AGENT)]) -> JSONResponse:
    """Store profiling data (scope ``agent``). A microbenchmark calibration becomes the one plans
    for that GPU use (newest wins; the plan's ``time.calibration`` names it)."""
    if payload.kind == "microbenchmark" and "calibration" in payload.data:
        uow.after_commit(rt.calibrations.clear)  # this process applies it at once; others within a second
    profile = await uow.run(lambda s: profile_out(service.create(s, payload, principal)))
    return JSONResponse({"profile": profile}, status_code=201)


@router.get("", response_model=ProfilePage, responses={422: _PROBLEM})
async def list_profiles(uow: UoW, _: Annotated[Principal, require(Scope.PLANS_READ)],
                  hardware_key: Annotated[str | None, Query(max_length=200)] = None,
                  kind: Literal["microbenchmark", "validation"] | None = None,
                  cursor: CursorParam = None,
                  limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT) -> JSONResponse:
    """Profiles, newest first (scope ``plans:read`` or ``admin``)."""
    def work(session: Session) -> dict[str, Any]:
        rows, nxt = ProfileRepository(session).list_page(hardware_key, kind, cursor, limit)
        return {"profiles": [profile_out(p) for p in rows], "next_cursor": nxt}
    return JSONResponse(await uow.run(work, read_only=True))

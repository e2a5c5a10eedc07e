"""``GET /v1/whoami``: the caller's name and scopes (the dashboard shows what a token may do)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from parplan.service.auth.service import Principal, Scope
from parplan.service.deps import RuntimeDep, require

router = APIRouter(prefix="/v1", tags=["auth"])


@router.get("/whoami")
async def whoami(rt: RuntimeDep, principal: Annotated[Principal, require(*Scope)]) -> JSONResponse:
    """The token's name and effective scopes, and whether this server requires tokens at all."""
    return JSONResponse({"name": principal.name, "scopes": sorted(s.value for s in principal.scopes),
                         "auth_required": rt.settings.auth_required})

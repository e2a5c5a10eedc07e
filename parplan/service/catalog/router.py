"""``GET /v1/models`` and ``GET /v1/clusters/presets``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from parplan.service.auth.service import Principal, Scope
from parplan.service.catalog import service
from parplan.service.catalog.schemas import GpuList, ModelList
from parplan.service.deps import require

router = APIRouter(prefix="/v1", tags=["catalog"])
_ANY = require(*Scope)


@router.get("/models", response_model=ModelList)
async def list_models(_: Annotated[Principal, _ANY]) -> JSONResponse:
    """Model presets, usable as ``{"model": {"preset": name}}``."""
    return JSONResponse({"models": service.model_presets()})


@router.get("/clusters/presets", response_model=GpuList)
async def list_gpu_presets(_: Annotated[Principal, _ANY]) -> JSONResponse:
    """GPU presets, usable as ``cluster.gpu``."""
    return JSONResponse({"gpus": service.gpu_presets()})

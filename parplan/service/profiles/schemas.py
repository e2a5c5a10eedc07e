"""Wire shapes of profiling data."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from parplan.service.models import Profile


class ProfileIn(BaseModel):
    """Profiling data from an agent. A microbenchmark's ``data`` may carry ``{"calibration":
    <Calibration.to_dict()>}``; plans for the GPU preset ``hardware_key`` names then use it."""

    model_config = ConfigDict(extra="forbid")

    hardware_key: str = Field(min_length=1, max_length=200, examples=["H100-80GB"])
    kind: Literal["microbenchmark", "validation"]
    data: dict[str, Any]
    agent_id: uuid.UUID | None = None


class ProfileOut(BaseModel):
    id: uuid.UUID
    hardware_key: str
    gpu: str | None = Field(description="The GPU preset hardware_key resolves to, if any.")
    kind: str
    data: dict[str, Any]
    calibration: dict[str, Any] | None
    agent_id: uuid.UUID | None
    validation_id: uuid.UUID | None
    created_at: datetime


class ProfileEnvelope(BaseModel):
    profile: ProfileOut


class ProfilePage(BaseModel):
    profiles: list[ProfileOut]
    next_cursor: str | None


def profile_out(p: Profile) -> dict[str, Any]:
    return {"id": str(p.id), "hardware_key": p.hardware_key, "gpu": p.gpu, "kind": p.kind, "data": p.data,
            "calibration": p.calibration, "agent_id": str(p.agent_id) if p.agent_id else None,
            "validation_id": str(p.validation_id) if p.validation_id else None,
            "created_at": p.created_at.isoformat()}

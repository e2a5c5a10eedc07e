"""Wire shapes of agents."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from parplan.service.models import Agent
from parplan.solver.request import Integer


class HardwareIn(BaseModel):
    """What the agent runs on. ``key`` names the hardware its measurements describe; use the GPU
    preset name (``GET /v1/clusters/presets``, e.g. ``H100-80GB``) so calibrations apply to plans."""

    model_config = ConfigDict(extra="allow", strict=True)

    key: str = Field(min_length=1, max_length=200)
    device: Literal["cpu", "cuda"]
    device_name: str = Field(max_length=200)
    device_count: Integer = Field(ge=1)
    memory_bytes: Integer = Field(ge=0)
    torch_version: str = Field(max_length=100)


class AgentRegister(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(min_length=1, max_length=200)
    hardware: HardwareIn


class AgentOut(BaseModel):
    id: uuid.UUID
    name: str
    hardware: dict[str, Any]
    hardware_key: str
    created_at: datetime
    last_heartbeat_at: datetime


class AgentEnvelope(BaseModel):
    agent: AgentOut


class AgentPage(BaseModel):
    agents: list[AgentOut]
    next_cursor: str | None


def agent_out(a: Agent) -> dict[str, Any]:
    return {"id": str(a.id), "name": a.name, "hardware": a.hardware, "hardware_key": a.hardware_key,
            "created_at": a.created_at.isoformat(), "last_heartbeat_at": a.last_heartbeat_at.isoformat()}

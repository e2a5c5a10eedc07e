"""Wire shapes of validations (the agent protocol)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from parplan.service.models import Validation
from parplan.solver.request import PositiveInteger


class Shrink(BaseModel):
    """Run a smaller model of the same shape (fewer layers, narrower hidden) to fit the agent."""

    model_config = ConfigDict(extra="forbid", strict=True)

    layers: PositiveInteger | None = None
    hidden: PositiveInteger | None = None


class ValidationCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    shrink: Shrink | None = None


class ClaimIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    agent_id: uuid.UUID
    wait_seconds: float = Field(default=0.0, ge=0, le=30, strict=True,
                                description="Long-poll up to this long (204 if none); at most the service's "
                                "PARPLAN_MAX_CLAIM_WAIT_SECONDS.")


class ResultIn(BaseModel):
    # The schema says what the validator below checks: a succeeded result carries its measurement.
    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "if": {"properties": {"status": {"const": "succeeded"}}},
        "then": {"required": ["measurement"], "properties": {"measurement": {"type": "object"}}}})

    agent_id: uuid.UUID
    status: Literal["succeeded", "failed"]
    error: str | None = Field(default=None, max_length=20_000)
    measurement: dict[str, Any] | None = Field(
        default=None, description='Free-form; includes "hardware_key", "ranks": [{"rank", "measured": '
        '{"peak_bytes", "breakdown"}, "predicted": {...}}] and "max_relative_error".')

    @model_validator(mode="after")
    def _measured_if_succeeded(self) -> ResultIn:
        if self.status == "succeeded" and self.measurement is None:
            raise ValueError("a succeeded validation needs its measurement")
        return self


class ValidationOut(BaseModel):
    id: uuid.UUID
    plan_id: uuid.UUID
    status: Literal["queued", "running", "succeeded", "failed"]
    agent_id: uuid.UUID | None
    shrink: Shrink | None
    result: dict[str, Any] | None
    error: str | None
    created_at: datetime
    claimed_at: datetime | None
    finished_at: datetime | None
    url: str


class ValidationEnvelope(BaseModel):
    validation: ValidationOut


class ClaimedValidation(ValidationOut):
    plan: dict[str, Any] = Field(description="The plan document to run.")
    request: dict[str, Any] = Field(description="The plan request the plan answers.")


class ClaimedEnvelope(BaseModel):
    validation: ClaimedValidation


def validation_out(v: Validation) -> dict[str, Any]:
    return {"id": str(v.id), "plan_id": str(v.plan_id), "status": v.status,
            "agent_id": str(v.agent_id) if v.agent_id else None, "shrink": v.shrink, "result": v.result,
            "error": v.error, "created_at": v.created_at.isoformat(),
            "claimed_at": v.claimed_at.isoformat() if v.claimed_at else None,
            "finished_at": v.finished_at.isoformat() if v.finished_at else None,
            "url": f"/v1/validations/{v.id}"}

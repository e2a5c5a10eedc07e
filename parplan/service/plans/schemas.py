"""Wire shapes of plans (docs/design.md, "HTTP API"); a plan request's is :mod:`parplan.solver.request`'s."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from parplan.service.jobs.schemas import JobOut


class PlanOut(BaseModel):
    """A plan: the solver's document (the keys of ``parplan plan --json``) plus ``id`` and
    ``created_at``."""

    model_config = ConfigDict(extra="allow")

    id: uuid.UUID
    created_at: datetime
    model: dict[str, Any] | None = None
    cluster: dict[str, Any] | None = None
    strategy: dict[str, Any] | None = None
    memory: dict[str, Any] | None = None
    time: dict[str, Any] | None = None
    baselines: dict[str, Any] | None = None
    solver: dict[str, Any] | None = None


class PlanSubmitted(BaseModel):
    """202: the job (poll its URL). 200: ``cached`` is true and ``plan`` is the finished plan."""

    job: JobOut
    plan: PlanOut | None = None
    cached: bool = False


class ExportOut(BaseModel):
    """A plan written for one trainer (``GET /v1/plans/{id}/export``): file name -> text, the launch
    commands (one per node where they differ) and what the user still has to add."""

    target: str
    version: str = Field(description="The trainer's version the files are written for.")
    files: dict[str, str]
    launch: list[str]
    notes: list[str]

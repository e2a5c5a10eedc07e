"""Database tables (SQLAlchemy 2.0 typed models). Migrations: ``parplan/service/migrations``.

Every timestamp is timezone-aware UTC; ids are UUIDs; JSON documents are JSONB on PostgreSQL.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import BigInteger, Boolean, Float, ForeignKey, Index, Integer, String, Text, Uuid
from sqlalchemy.orm import Mapped, mapped_column

from parplan.service.database import Base, JSONType, new_id, utcnow


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


class ValidationStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class ProfileKind(StrEnum):
    MICROBENCHMARK = "microbenchmark"
    VALIDATION = "validation"


class ApiToken(Base):
    """A bearer token; only the SHA-256 of the secret is stored."""

    __tablename__ = "api_tokens"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(200))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    scopes: Mapped[list[str]] = mapped_column(JSONType)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)
    expires_at: Mapped[datetime | None] = mapped_column(default=None)


class Plan(Base):
    """A solved plan, keyed by the request's cache key (request hash with the solver version,
    and the calibration it was solved with)."""

    __tablename__ = "plans"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=new_id)
    cache_key: Mapped[str] = mapped_column(String(64), unique=True)
    request_hash: Mapped[str] = mapped_column(String(64), index=True)
    solver_version: Mapped[str] = mapped_column(String(40))
    calibration_source: Mapped[str] = mapped_column(String(200))
    request: Mapped[dict[str, Any]] = mapped_column(JSONType, deferred=True)
    document: Mapped[dict[str, Any]] = mapped_column(JSONType)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Job(Base):
    """One plan request on its way through the queue. ``lease_owner``/``deadline_at`` belong
    to the worker that claimed it; the sweeper re-queues a running job past its deadline."""

    __tablename__ = "jobs"
    __table_args__ = (
        Index("ix_jobs_status_created", "status", "created_at"),
        Index("ix_jobs_created", "created_at", "id"),
        Index("ix_jobs_status_deadline", "status", "deadline_at"),
        Index("ix_jobs_cache_key_status", "cache_key", "status"),
        Index("ix_jobs_token_status", "token_id", "status"),
    )

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=new_id)
    #: ``plan`` (a worker solves it), ``capacity`` or ``replan`` (a sweep: its cells are plan jobs).
    kind: Mapped[str] = mapped_column(String(16), default="plan", server_default="plan")
    status: Mapped[str] = mapped_column(String(16), default=JobStatus.QUEUED.value)
    # Deferred: only workers read them (JobRepository.claim loads them).
    request: Mapped[dict[str, Any]] = mapped_column(JSONType, deferred=True)
    request_hash: Mapped[str] = mapped_column(String(64))
    cache_key: Mapped[str] = mapped_column(String(64))
    calibration: Mapped[dict[str, Any] | None] = mapped_column(JSONType, default=None, deferred=True)
    progress_stage: Mapped[str | None] = mapped_column(String(200), default=None)
    progress_fraction: Mapped[float] = mapped_column(Float, default=0.0)
    plan_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("plans.id"), default=None, index=True)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSONType, default=None)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    lease_owner: Mapped[str | None] = mapped_column(String(64), default=None)
    worker: Mapped[str | None] = mapped_column(String(200), default=None)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    solve_seconds: Mapped[float | None] = mapped_column(Float, default=None)
    token_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("api_tokens.id"), default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
    enqueued_at: Mapped[datetime | None] = mapped_column(default=None)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
    deadline_at: Mapped[datetime | None] = mapped_column(default=None)


class JobEvent(Base):
    """One change of a job that its watchers see (a status, progress, or the cancel flag), with the
    job's document as it was then. Written in the transaction that made the change, after the
    job's row is locked, so one job's ids grow in the order of its changes; ``id`` is the event id
    of ``GET /v1/jobs/{id}/events``."""

    __tablename__ = "job_events"
    __table_args__ = (Index("ix_job_events_job_id", "job_id", "id"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
                                    autoincrement=True)
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id"))
    status: Mapped[str] = mapped_column(String(16))
    document: Mapped[dict[str, Any]] = mapped_column(JSONType)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Sweep(Base):
    """A capacity sweep or a replan: its job (``kind`` capacity or replan; it ends when its cells
    have) and the request. Its cells are plan jobs, listed in ``sweep_cells``."""

    __tablename__ = "sweeps"

    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    request: Mapped[dict[str, Any]] = mapped_column(JSONType)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class SweepCell(Base):
    """One plan of a sweep: the pool's GPU and count, and the plan job that answers it (a job this
    sweep created, ``owned``, or one it joined: the same request already queued, running or
    solved)."""

    __tablename__ = "sweep_cells"
    __table_args__ = (Index("ix_sweep_cells_job", "job_id"),)

    sweep_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("sweeps.job_id"), primary_key=True)
    idx: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    gpu: Mapped[str] = mapped_column(String(64))
    gpus: Mapped[int] = mapped_column(Integer)
    job_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("jobs.id"))
    owned: Mapped[bool] = mapped_column(Boolean, default=False)


class Agent(Base):
    """A validation agent; ``hardware_key`` names the hardware its measurements describe."""

    __tablename__ = "agents"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(200))
    hardware: Mapped[dict[str, Any]] = mapped_column(JSONType)
    hardware_key: Mapped[str] = mapped_column(String(200), index=True)
    token_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("api_tokens.id"), default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_heartbeat_at: Mapped[datetime] = mapped_column(default=utcnow)


class Validation(Base):
    """A request to run a plan on real hardware; claimed by an agent, which posts the result."""

    __tablename__ = "validations"
    __table_args__ = (Index("ix_validations_status_created", "status", "created_at"),)

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=new_id)
    plan_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("plans.id"), index=True)
    status: Mapped[str] = mapped_column(String(16), default=ValidationStatus.QUEUED.value)
    shrink: Mapped[dict[str, Any] | None] = mapped_column(JSONType, default=None)
    agent_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("agents.id"), default=None, index=True)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSONType, default=None)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    claimed_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)


class Profile(Base):
    """Profiling data from an agent: microbenchmarks (may carry a calibration) or a validation's
    measured-vs-predicted memory. ``gpu`` is the GPU preset ``hardware_key`` resolves to, if any."""

    __tablename__ = "profiles"
    __table_args__ = (
        Index("ix_profiles_key_kind_created", "hardware_key", "kind", "created_at"),
        Index("ix_profiles_gpu_kind_created", "gpu", "kind", "created_at"),
        Index("ix_profiles_created", "created_at", "id"),
    )

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=new_id)
    hardware_key: Mapped[str] = mapped_column(String(200))
    gpu: Mapped[str | None] = mapped_column(String(64), default=None)
    kind: Mapped[str] = mapped_column(String(32))
    data: Mapped[dict[str, Any]] = mapped_column(JSONType)
    calibration: Mapped[dict[str, Any] | None] = mapped_column(JSONType, default=None)
    agent_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("agents.id"), default=None)
    validation_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("validations.id"), default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

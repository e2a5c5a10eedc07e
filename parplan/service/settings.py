"""The service's one settings object (pydantic-settings, environment prefix ``PARPLAN_``).

With nothing set, ``parplan serve`` runs the *embedded default*: a SQLite file under
:attr:`Settings.data_dir`, jobs solved by an in-process executor, bound to 127.0.0.1. Setting
``PARPLAN_DATABASE_URL`` (PostgreSQL) and ``PARPLAN_BROKER_URL`` (Redis) switches to the
production layout: Celery workers fed through Redis, state in PostgreSQL.
"""

from __future__ import annotations

import ipaddress
import os
from enum import StrEnum
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def _default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "parplan"


class AuthMode(StrEnum):
    """``auto``: tokens required unless the embedded default is bound to loopback."""

    AUTO = "auto"
    REQUIRED = "required"
    DISABLED = "disabled"


class Settings(BaseSettings):
    """Every knob of the service, API and workers alike. Durations in seconds, sizes in bytes."""

    model_config = SettingsConfigDict(env_prefix="PARPLAN_", extra="ignore")

    # -- state stores -------------------------------------------------------------------------
    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL, e.g. postgresql+psycopg://user:pw@host/db. "
        "Unset: a SQLite file in data_dir (the embedded default).")
    broker_url: str | None = Field(
        default=None, description="Redis URL of the Celery broker. Unset: jobs run in an in-process executor.")
    data_dir: Path = Field(default_factory=_default_data_dir, description="Where the embedded SQLite file lives.")
    queue_name: str = Field(default="parplan", description="Celery queue (Redis list) the jobs go through.")

    # -- HTTP -----------------------------------------------------------------------------------
    host: str = Field(default="127.0.0.1", description="Address `parplan serve` binds.")
    port: int = Field(default=8000, ge=0, le=65535)
    auth: AuthMode = Field(default=AuthMode.AUTO, description="auto | required | disabled (loopback only).")
    max_body_bytes: int = Field(default=8 * 2**20, ge=1024, description="Larger request bodies get 413.")
    max_graph_nodes: int = Field(default=50_000, ge=1, description="Larger model graphs get 413.")
    max_devices: int = Field(default=16_384, ge=1, description="cluster.gpus above this gets 422.")

    # -- jobs -----------------------------------------------------------------------------------
    executor_workers: int = Field(default_factory=lambda: max(1, (os.cpu_count() or 2) - 1), ge=1,
                                  description="Solves at once in the in-process executor (embedded default).")
    job_lease_seconds: float = Field(default=30.0, gt=0, description="A running job whose worker has not "
                                     "renewed its lease for this long is re-queued by the sweeper.")
    job_requeue_seconds: float = Field(default=60.0, gt=0, description="A queued job not picked up for this "
                                       "long is enqueued again (its broker message may have been lost).")
    job_max_attempts: int = Field(default=3, ge=1, description="Workers lost on one job before it fails.")
    job_timeout_seconds: float = Field(default=3600.0, gt=0, description="Wall-clock limit of one solve.")
    sweep_interval_seconds: float = Field(default=10.0, gt=0, description="How often `serve` runs the sweeper.")
    dispatch_window: int = Field(default=4, ge=0, description="Celery layout: jobs the broker's queue holds at "
                                 "most; the rest wait in the database and are released in turn by token (fair "
                                 "scheduling). About the number of solves the workers run at once; 0: every job "
                                 "goes to the broker at once, first come first served.")
    dispatch_interval_seconds: float = Field(default=0.5, gt=0, description="How often each API process tops up "
                                             "the broker's queue from the jobs waiting in the database, when it "
                                             "has room (workers also do as each task starts).")
    sweeper: bool = Field(default=True, description="Run the sweeper inside `parplan serve`.")
    agent_timeout_seconds: float = Field(default=60.0, gt=0, description="A claimed validation whose agent "
                                         "has not sent a heartbeat for this long goes back to the queue.")

    # -- security and overload (docs/service.md, "Security" and "Overload") -------------------------
    cors_origins: str = Field(default="", description="Comma-separated origins allowed to call the API from a "
                              "browser (CORS); empty: no CORS headers at all. `*` allows any origin (no credentials).")
    solver_nice: int = Field(default=10, ge=0, le=19, description="How much lower than its worker the CPU "
                             "priority of each solver child process is (os.nice): on a host shared with the API, "
                             "solves take the cores the API leaves idle, and requests are answered first. "
                             "0: the same priority.")
    max_time_limit_seconds: float = Field(default=3600.0, gt=0, description="Largest `time_limit` a plan request "
                                          "may ask for (larger: 422); a request without one gets "
                                          "min(60, this).")
    rate_limit_per_second: float = Field(default=0.0, ge=0, description="Requests per second each token (or "
                                         "each client address without a token) may make to /v1; 0: no limit. Over it: "
                                         "429 with Retry-After. Counted in Redis when broker_url is set (shared by "
                                         "every API process), else per API process.")
    rate_limit_burst: int = Field(default=20, ge=1, description="Requests a token may make at once before "
                                  "rate_limit_per_second applies.")
    max_active_jobs_per_token: int = Field(default=100, ge=1, description="Queued or running jobs one token may "
                                           "have; another new job gets 429 with Retry-After.")
    max_queued_jobs: int = Field(default=10_000, ge=1, description="Queued jobs the service holds; a new job "
                                 "beyond that gets 503 with Retry-After.")
    max_claim_wait_seconds: float = Field(default=30.0, ge=0, le=30, description="Longest long poll of an "
                                          "agent's claim (`wait_seconds`; larger: 422).")
    max_job_wait_seconds: float = Field(default=60.0, ge=0, le=60, description="Longest long poll of a job "
                                        "(`GET /v1/jobs/{id}?wait=`; larger: 422).")
    retry_after_seconds: int = Field(default=5, ge=1, description="Retry-After of a 503 for a full queue or an "
                                     "unavailable database.")

    @property
    def cors_origin_list(self) -> list[str]:
        return [o.strip() for o in self.cors_origins.split(",") if o.strip()]

    @field_validator("database_url", "broker_url", mode="before")
    @classmethod
    def _empty_is_unset(cls, v: object) -> object:
        return None if v == "" else v

    @property
    def embedded(self) -> bool:
        """True when no database URL is configured (SQLite file in data_dir)."""
        return self.database_url is None

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            url = self.database_url
            # Plain postgresql:// URLs get the psycopg 3 driver this package ships with.
            for prefix in ("postgresql://", "postgres://"):
                if url.startswith(prefix):
                    return "postgresql+psycopg://" + url[len(prefix):]
            return url
        return f"sqlite:///{self.data_dir / 'parplan.db'}"

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)

    @property
    def auth_required(self) -> bool:
        if self.auth is AuthMode.AUTO:
            return not (self.embedded and self.loopback)
        return self.auth is AuthMode.REQUIRED


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False

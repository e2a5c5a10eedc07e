"""Initial schema: api_tokens, plans, jobs, agents, validations, profiles.

Revision ID: 0001
Revises:

Self-contained: the column types are spelled out here (JSONB on PostgreSQL, JSON elsewhere;
timestamps with time zone), not imported from the models, so later model changes cannot alter
what this revision creates.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _json() -> sa.types.TypeEngine[Any]:
    return sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")


def _ts(name: str, nullable: bool) -> sa.Column[Any]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def _api_tokens() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Uuid(), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("scopes", _json(), nullable=False),
        _ts("created_at", False),
        _ts("revoked_at", True),
        sa.UniqueConstraint("token_hash", name="uq_api_tokens_token_hash"),
    )


def _plans() -> None:
    op.create_table(
        "plans",
        sa.Column("id", sa.Uuid(), primary_key=True),
        sa.Column("cache_key", sa.String(64), nullable=False),
        sa.Column("request_hash", sa.String(64), nullable=False),
        sa.Column("solver_version", sa.String(40), nullable=False),
        sa.Column("calibration_source", sa.String(200), nullable=False),
        sa.Column("request", _json(), nullable=False),
        sa.Column("document", _json(), nullable=False),
        _ts("created_at", False),
        sa.UniqueConstraint("cache_key", name="uq_plans_cache_key"),
    )
    op.create_index("ix_plans_request_hash", "plans", ["request_hash"])


def _agents() -> None:
    op.create_table(
        "agents",
        sa.Column("id", sa.Uuid(), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("hardware", _json(), nullable=False),
        sa.Column("hardware_key", sa.String(200), nullable=False),
        sa.Column("token_id", sa.Uuid(), sa.ForeignKey("api_tokens.id", name="fk_agents_token"), nullable=True),
        _ts("created_at", False),
        _ts("last_heartbeat_at", False),
    )
    op.create_index("ix_agents_hardware_key", "agents", ["hardware_key"])


def _jobs() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.Uuid(), primary_key=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("request", _json(), nullable=False),
        sa.Column("request_hash", sa.String(64), nullable=False),
        sa.Column("cache_key", sa.String(64), nullable=False),
        sa.Column("calibration", _json(), nullable=True),
        sa.Column("progress_stage", sa.String(200), nullable=True),
        sa.Column("progress_fraction", sa.Float(), nullable=False),
        sa.Column("plan_id", sa.Uuid(), sa.ForeignKey("plans.id", name="fk_jobs_plan"), nullable=True),
        sa.Column("error", _json(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("lease_owner", sa.String(64), nullable=True),
        sa.Column("worker", sa.String(200), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("solve_seconds", sa.Float(), nullable=True),
        sa.Column("token_id", sa.Uuid(), sa.ForeignKey("api_tokens.id", name="fk_jobs_token"), nullable=True),
        _ts("created_at", False),
        _ts("updated_at", False),
        _ts("enqueued_at", True),
        _ts("started_at", True),
        _ts("finished_at", True),
        _ts("deadline_at", True),
    )
    op.create_index("ix_jobs_cache_key_status", "jobs", ["cache_key", "status"])
    op.create_index("ix_jobs_created", "jobs", ["created_at", "id"])
    op.create_index("ix_jobs_plan_id", "jobs", ["plan_id"])
    op.create_index("ix_jobs_status_created", "jobs", ["status", "created_at"])
    op.create_index("ix_jobs_status_deadline", "jobs", ["status", "deadline_at"])


def _validations() -> None:
    op.create_table(
        "validations",
        sa.Column("id", sa.Uuid(), primary_key=True),
        sa.Column("plan_id", sa.Uuid(), sa.ForeignKey("plans.id", name="fk_validations_plan"), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("shrink", _json(), nullable=True),
        sa.Column("agent_id", sa.Uuid(), sa.ForeignKey("agents.id", name="fk_validations_agent"), nullable=True),
        sa.Column("result", _json(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        _ts("created_at", False),
        _ts("claimed_at", True),
        _ts("finished_at", True),
    )
    op.create_index("ix_validations_agent_id", "validations", ["agent_id"])
    op.create_index("ix_validations_plan_id", "validations", ["plan_id"])
    op.create_index("ix_validations_status_created", "validations", ["status", "created_at"])


def _profiles() -> None:
    op.create_table(
        "profiles",
        sa.Column("id", sa.Uuid(), primary_key=True),
        sa.Column("hardware_key", sa.String(200), nullable=False),
        sa.Column("gpu", sa.String(64), nullable=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("data", _json(), nullable=False),
        sa.Column("calibration", _json(), nullable=True),
        sa.Column("agent_id", sa.Uuid(), sa.ForeignKey("agents.id", name="fk_profiles_agent"), nullable=True),
        sa.Column("validation_id", sa.Uuid(), sa.ForeignKey("validations.id", name="fk_profiles_validation"),
                  nullable=True),
        _ts("created_at", False),
    )
    op.create_index("ix_profiles_created", "profiles", ["created_at", "id"])
    op.create_index("ix_profiles_gpu_kind_created", "profiles", ["gpu", "kind", "created_at"])
    op.create_index("ix_profiles_key_kind_created", "profiles", ["hardware_key", "kind", "created_at"])


def upgrade() -> None:
    # each table after those its foreign keys name
    for create in (_api_tokens, _plans, _agents, _jobs, _validations, _profiles):
        create()


def downgrade() -> None:
    for table in ("profiles", "validations", "jobs", "agents", "plans", "api_tokens"):
        op.drop_table(table)

"""Capacity sweeps and replans: ``jobs.kind``, ``sweeps`` (the request of a sweep job) and
``sweep_cells`` (each cell's plan job).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _json() -> sa.types.TypeEngine[Any]:
    return sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("kind", sa.String(16), nullable=False, server_default="plan"))
    op.create_table(
        "sweeps",
        sa.Column("job_id", sa.Uuid(), sa.ForeignKey("jobs.id", name="fk_sweeps_job"), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("request", _json(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "sweep_cells",
        sa.Column("sweep_id", sa.Uuid(), sa.ForeignKey("sweeps.job_id", name="fk_sweep_cells_sweep"),
                  primary_key=True),
        sa.Column("idx", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("gpu", sa.String(64), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Uuid(), sa.ForeignKey("jobs.id", name="fk_sweep_cells_job"), nullable=False),
        sa.Column("owned", sa.Boolean(), nullable=False),
    )
    op.create_index("ix_sweep_cells_job", "sweep_cells", ["job_id"])


def downgrade() -> None:
    op.drop_index("ix_sweep_cells_job", table_name="sweep_cells")
    op.drop_table("sweep_cells")
    op.drop_table("sweeps")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("kind")

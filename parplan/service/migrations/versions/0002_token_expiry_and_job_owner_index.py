"""Tokens can expire (``api_tokens.expires_at``); jobs are counted per submitting token
(index ``ix_jobs_token_status`` on ``jobs (token_id, status)``, for the concurrent-job limit).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("api_tokens", sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_jobs_token_status", "jobs", ["token_id", "status"])


def downgrade() -> None:
    op.drop_index("ix_jobs_token_status", table_name="jobs")
    with op.batch_alter_table("api_tokens") as batch:
        batch.drop_column("expires_at")

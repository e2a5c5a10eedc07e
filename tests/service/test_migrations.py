"""Alembic migrations run on PostgreSQL and SQLite, go down and up again, and match the models."""

from __future__ import annotations

import os
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect
from sqlalchemy.pool import NullPool

from parplan.service import models  # noqa: F401 - registers the tables
from parplan.service.database import Base
from parplan.service.migrate import current_revision, downgrade, head_revision, upgrade
from tests.support.service import create_database, drop_database

TABLES = {"api_tokens", "plans", "jobs", "job_events", "sweeps", "sweep_cells", "agents", "validations", "profiles",
          "alembic_version"}


def _check(url: str) -> None:
    upgrade(url)
    assert current_revision(url) == head_revision()
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            assert set(inspect(conn).get_table_names()) == TABLES
            diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
            assert diff == [], diff
    finally:
        engine.dispose()
    downgrade(url, "base")
    assert current_revision(url) is None
    upgrade(url)
    assert current_revision(url) == head_revision()


def test_sqlite(tmp_path: Path) -> None:
    _check(f"sqlite:///{tmp_path / 'parplan.db'}")


def test_postgresql(pg_url: str) -> None:  # pg_url: the session's database proves reachability
    name = f"parplan_migr_{os.getpid()}"
    url = create_database(name)
    try:
        _check(url)
    finally:
        drop_database(name)


def test_upgrade_is_idempotent(tmp_path: Path) -> None:
    path = f"sqlite:///{tmp_path / 'x.db'}"
    upgrade(path)
    upgrade(path)
    assert current_revision(path) == head_revision()

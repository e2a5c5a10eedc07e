"""Which real database errors mean "unavailable, retry" (503) and which are bugs (500)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool, QueuePool

from parplan.service.db_errors import unavailable_reason
from tests.support.service import POSTGRES_ADMIN_URL, free_port, postgres_available, unreachable


def _error(url: str, sql: str, **engine_args: Any) -> SQLAlchemyError:
    engine = create_engine(url, **engine_args)
    try:
        with engine.begin() as c:
            c.execute(text(sql))
    except SQLAlchemyError as e:
        return e
    finally:
        engine.dispose()
    raise AssertionError(f"{sql!r} did not fail")


def test_sqlite_read_only_is_unavailable_and_a_missing_table_is_not(tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    engine = create_engine(f"sqlite:///{db}")
    with engine.begin() as c:
        c.execute(text("CREATE TABLE t (x INTEGER)"))
    engine.dispose()
    read_only = _error(f"sqlite:///file:{db}?mode=ro&uri=true", "INSERT INTO t VALUES (1)")
    reason = unavailable_reason(read_only)
    assert reason is not None and "SQLITE_READONLY" in reason
    assert unavailable_reason(_error(f"sqlite:///{db}", "SELECT * FROM missing")) is None


def test_postgres_unreachable_is_unavailable() -> None:
    err = _error(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/postgres", "SELECT 1", poolclass=NullPool)
    assert unavailable_reason(err) == "the database cannot be reached (OperationalError)"


def test_postgres_query_errors_are_not_unavailable() -> None:
    why = postgres_available()
    if why is not None:
        unreachable("PostgreSQL", why)  # skipped, or failed under CI=true
    assert unavailable_reason(_error(POSTGRES_ADMIN_URL, "SELECT * FROM no_such_table", poolclass=NullPool)) is None
    assert unavailable_reason(_error(POSTGRES_ADMIN_URL, "SELECT 1/0", poolclass=NullPool)) is None


def test_an_exhausted_pool_is_unavailable(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'p.db'}", poolclass=QueuePool, pool_size=1, max_overflow=0,
                           pool_timeout=0.05)
    held = engine.connect()
    try:
        with pytest.raises(SQLAlchemyError) as exc:
            engine.connect()
        assert unavailable_reason(exc.value) == "no free database connection (the pool is exhausted)"
    finally:
        held.close()
        engine.dispose()
    assert unavailable_reason(ValueError("not a database error")) is None

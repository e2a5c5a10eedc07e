"""Alembic environment: runs against ``config.attributes["connection"]`` when given (tests),
else the ``sqlalchemy.url`` option, else the service's settings. On PostgreSQL an advisory lock
serialises concurrent upgrades (several API replicas starting at once)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine, text
from sqlalchemy.pool import NullPool

from parplan.service import models  # noqa: F401 - registers the tables on Base.metadata
from parplan.service.database import Base
from parplan.service.settings import Settings

config = context.config
target_metadata = Base.metadata
LOCK_ID = 0x70617270  # "parp"


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata,
                      render_as_batch=connection.dialect.name == "sqlite", compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


def run_offline() -> None:
    context.configure(url=config.get_main_option("sqlalchemy.url") or Settings().resolved_database_url,
                      target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    given = config.attributes.get("connection")
    if given is not None:
        _run(given)
        return
    url = config.get_main_option("sqlalchemy.url") or Settings().resolved_database_url
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            pg = conn.dialect.name == "postgresql"
            if pg:
                conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": LOCK_ID})
                conn.commit()
            try:
                _run(conn)
                conn.commit()
            finally:
                if pg:
                    conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": LOCK_ID})
                    conn.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()

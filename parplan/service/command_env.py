"""What the service's commands share: settings from the environment, a one-line description of
the layout (secrets hidden), and the schema upgrade. Imports only the standard library at load."""

from __future__ import annotations

from typing import Any


def settings_from_env(**overrides: Any) -> Any:
    """``Settings()`` from the environment, with the overrides that are not None."""
    from parplan.service.settings import Settings

    return Settings(**{k: v for k, v in overrides.items() if v is not None})


def store(settings: Any) -> str:
    """The database, for people (no password)."""
    if settings.embedded:
        return f"SQLite {settings.data_dir / 'parplan.db'}"
    from sqlalchemy.engine import make_url

    return str(make_url(settings.resolved_database_url).render_as_string(hide_password=True))


def describe(settings: Any) -> str:
    """The database and the queue, e.g. ``database SQLite ...; jobs: in-process executor (...)``."""
    if settings.broker_url:
        from sqlalchemy.engine import make_url

        queue = f"Celery via {make_url(settings.broker_url).render_as_string(hide_password=True)}"
    else:
        queue = f"in-process executor ({settings.executor_workers} solver process(es) at a time)"
    return f"database {store(settings)}; jobs: {queue}"


def upgrade_schema(settings: Any) -> None:
    """Migrate the configured database to head (the embedded data directory made first)."""
    from parplan.service.migrate import upgrade

    if settings.embedded:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    upgrade(settings.resolved_database_url)

"""Fixtures: real PostgreSQL (rolled back per test, or committed and emptied for tests with other
processes or threads), real Redis, and settings with short leases so fault tests run fast."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from parplan.service.settings import Settings
from tests.support.service import (
    Proc,
    committed_db,
    db,
    make_settings,
    pg_engine,
    pg_url,
    queue_name,
    redis_url,
)

# The shared fixtures, re-exported so pytest finds them here.
__all__ = ["committed_db", "db", "pg_engine", "pg_url", "queue_name", "redis_url"]


@pytest.fixture
def settings(pg_url: str, redis_url: str, queue_name: str) -> Settings:
    return make_settings(pg_url, redis_url, queue_name, job_lease_seconds=2.0, job_requeue_seconds=2.0,
                         job_max_attempts=3)




@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    """Server and worker processes a test starts; stopped when it ends."""
    started: list[Proc] = []
    yield started
    for p in started:
        p.stop()

"""Fixtures: the app in-process over the real PostgreSQL (each test's transaction rolled back)
and a real Celery queue in Redis (a queue name per test, purged after it)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from parplan.service.app import create_app
from parplan.service.auth.service import Scope
from parplan.service.runtime import Runtime
from parplan.service.settings import Settings
from parplan.workers.celery_app import CeleryJobQueue
from tests.support.service import (
    committed_db,
    db,
    make_settings,
    make_token,
    pg_engine,
    pg_url,
    queue_name,
    redis_url,
)

Headers = dict[str, str]

# The shared fixtures, re-exported so pytest finds them here.
__all__ = ["committed_db", "db", "pg_engine", "pg_url", "queue_name", "redis_url"]


@pytest.fixture
def settings(pg_url: str, redis_url: str, queue_name: str) -> Settings:
    return make_settings(pg_url, redis_url, queue_name, max_graph_nodes=200, max_devices=4096)


@pytest.fixture
def runtime(settings: Settings, db: sessionmaker[Session], queue: CeleryJobQueue) -> Runtime:
    return Runtime(settings=settings, session_factory=db, queue=queue, run_sweeper=False)


@pytest.fixture
def client(runtime: Runtime) -> Iterator[TestClient]:
    with TestClient(create_app(runtime=runtime), raise_server_exceptions=False) as c:
        yield c


@pytest.fixture
def app_client(settings: Settings, queue: CeleryJobQueue) -> Iterator[Callable[..., TestClient]]:
    """``app_client(session_factory, **settings)``: a client of a new app instance (its own runtime
    and rate limiter, as another API process has) with those settings changed."""
    clients: list[TestClient] = []

    def make(sf: sessionmaker[Session], **changes: Any) -> TestClient:
        rt = Runtime(settings=settings.model_copy(update=changes), session_factory=sf, queue=queue, run_sweeper=False)
        c = TestClient(create_app(runtime=rt), raise_server_exceptions=False)
        c.__enter__()
        clients.append(c)
        return c

    yield make
    for c in clients:
        c.__exit__(None, None, None)


@pytest.fixture
def auth(db: sessionmaker[Session]) -> Callable[..., Headers]:
    """``auth(Scope.PLANS_WRITE)`` → headers carrying a fresh token with those scopes."""
    def headers(*scopes: Scope) -> Headers:
        return {"Authorization": f"Bearer {make_token(db, *scopes)}"}
    return headers


@pytest.fixture
def writer(auth: Callable[..., Headers]) -> Headers:
    return auth(Scope.PLANS_WRITE)


@pytest.fixture
def reader(auth: Callable[..., Headers]) -> Headers:
    return auth(Scope.PLANS_READ)


@pytest.fixture
def agent(auth: Callable[..., Headers]) -> Headers:
    return auth(Scope.AGENT)


@pytest.fixture
def admin(auth: Callable[..., Headers]) -> Headers:
    return auth(Scope.ADMIN)


@pytest.fixture
def mlp_graph() -> dict[str, Any]:
    """A small valid graph in the wire format (a two-matmul MLP block; tests/data/mlp_graph.json)."""
    doc: dict[str, Any] = json.loads((Path(__file__).parent.parent / "data" / "mlp_graph.json").read_text())
    return doc

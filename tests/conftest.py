"""Fixtures shared by the service and worker tests (each folder's conftest defines ``settings``), a
private cache of traced graphs for every test, and Hypothesis's profile: under ``CI=true`` its
examples are derandomised (the same on every run, so a run that lands is reproducible); elsewhere
they are random, to keep finding new cases. A case found that way is pinned with ``@example``."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings as hypothesis_settings

from parplan.service.settings import Settings
from parplan.workers.celery_app import CeleryJobQueue

hypothesis_settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI") == "true":
    hypothesis_settings.load_profile("ci")


@pytest.fixture
def queue(settings: Settings) -> Iterator[CeleryJobQueue]:
    """A Celery job queue on the test Redis, emptied before and after the test."""
    q = CeleryJobQueue(settings)
    q.purge()
    yield q
    q.purge()
    q.close()


@pytest.fixture(autouse=True)
def _private_trace_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Traced graphs are cached per test (never in the user's cache, never from another test)."""
    monkeypatch.setenv("PARPLAN_TRACE_CACHE", str(tmp_path_factory.mktemp("trace-cache")))

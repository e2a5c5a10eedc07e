"""Fixtures shared by the service and worker tests (each folder's conftest defines ``settings``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from parplan.service.settings import Settings
from parplan.workers.celery_app import CeleryJobQueue


@pytest.fixture
def queue(settings: Settings) -> Iterator[CeleryJobQueue]:
    """A Celery job queue on the test Redis, emptied before and after the test."""
    q = CeleryJobQueue(settings)
    q.purge()
    yield q
    q.purge()
    q.close()

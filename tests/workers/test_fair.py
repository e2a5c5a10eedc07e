"""Fair scheduling: the in-process executor starts waiting jobs in turn by submitting token."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from parplan.service.auth.service import Scope, create_token
from parplan.service.settings import Settings
from parplan.workers import inprocess
from parplan.workers.fair import FairQueue
from parplan.workers.inprocess import InProcessJobQueue
from tests.support.service import insert_job

SF = sessionmaker[Session]


def test_owners_are_served_in_turn() -> None:
    q: FairQueue[str] = FairQueue()
    for item in ("a1", "a2", "a3"):
        q.put("A", item)
    q.put("B", "b1")
    q.put(None, "n1")
    assert len(q) == 5
    assert [q.get(0) for _ in range(5)] == ["a1", "b1", "n1", "a2", "a3"]
    assert q.get(0.01) is None
    q.put("B", "b2")
    q.close()
    assert q.get(1) is None


def test_the_executor_starts_one_tokens_burst_after_anothers_job(committed_db: SF, settings: Settings,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    tokens = []
    with committed_db() as s:
        for name in ("burst", "other"):
            row, _ = create_token(s, name, frozenset({Scope.PLANS_WRITE}))
            tokens.append(row.id)
        s.commit()
    burst, other = tokens
    started: list[uuid.UUID] = []
    release = threading.Event()

    def fake_execute(job_id: uuid.UUID, *args: Any, **kwargs: Any) -> None:
        started.append(job_id)
        release.wait(10)

    monkeypatch.setattr(inprocess, "execute_job", fake_execute)
    add: Callable[[uuid.UUID], uuid.UUID] = lambda token: insert_job(  # noqa: E731
        committed_db, {}, "h", uuid.uuid4().hex, token_id=token)
    q = InProcessJobQueue(settings.model_copy(update={"executor_workers": 1}), committed_db)
    q.start()
    try:
        first = add(burst)
        q.enqueue(first)
        while not started:  # the one worker is busy with the first job
            threading.Event().wait(0.01)
        burst_jobs = [add(burst) for _ in range(3)]
        for j in burst_jobs:
            q.enqueue(j)
        late = add(other)
        q.enqueue(late)
        release.set()
        while len(started) < 5:
            threading.Event().wait(0.01)
    finally:
        release.set()
        q.close()
    assert started == [first, burst_jobs[0], late, burst_jobs[1], burst_jobs[2]]

"""Watching a job change: the long poll (``GET /v1/jobs/{id}?wait=``) and the event stream
(``GET /v1/jobs/{id}/events``).

Both layouts write a job's progress on its row (the in-process executor and Celery workers alike,
at every heartbeat and at every new stage), and every change a watcher sees as a ``job_events``
row in the same transaction. The long poll reads the job's row, the event stream its history, every
:data:`POLL_SECONDS`, each read in its own short session on a worker thread: a watcher holds no
database connection and no thread while it waits.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from parplan.service.jobs.repository import JobRepository
from parplan.service.jobs.schemas import job_out
from parplan.service.models import JobStatus

#: How often a watcher reads the job row.
POLL_SECONDS = 0.25
#: The longest ``?wait=`` a long poll may ask for.
MAX_WAIT_SECONDS = 60.0
#: A comment line on an idle event stream this often, so proxies keep the connection open.
KEEPALIVE_SECONDS = 15.0

#: Events read at a time; a stream replaying a long history reads on without pausing.
EVENTS_PER_READ = 200
#: The largest event id (a PostgreSQL BIGINT).
MAX_EVENT_ID = 2**63 - 1

JobDoc = dict[str, Any]


def fingerprint(job: JobDoc) -> tuple[Any, ...]:
    """What a watcher reports a change of: status, progress, plan, error and the cancel flag."""
    p = job["progress"]
    return job["status"], p["stage"], p["fraction"], job["plan_id"], job["cancel_requested"], bool(job["error"])


def is_terminal(job: JobDoc) -> bool:
    return JobStatus(job["status"]).terminal


def read_job(session_factory: Callable[[], Session], job_id: uuid.UUID) -> JobDoc | None:
    """The job's JSON form now (None if it is gone), in a short session of its own."""
    with session_factory() as s:
        job = JobRepository(s).get(job_id)
        return job_out(job) if job is not None else None


async def wait_for_change(session_factory: Callable[[], Session], job_id: uuid.UUID, first: JobDoc,
                          wait_seconds: float, poll_seconds: float = POLL_SECONDS) -> JobDoc:
    """``first`` once it is finished or ``wait_seconds`` passed without a change, else the job as
    soon as it differs from ``first``."""
    deadline = time.monotonic() + min(wait_seconds, MAX_WAIT_SECONDS)
    seen = fingerprint(first)
    current = first
    while not is_terminal(current):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        await asyncio.sleep(min(left, poll_seconds))
        latest = await run_in_threadpool(read_job, session_factory, job_id)
        if latest is None:
            break
        current = latest
        if fingerprint(current) != seen:
            break
    return current


def sse(event: str, data: JobDoc | dict[str, Any], event_id: int | None = None) -> bytes:
    """One Server-Sent Event (``event:``, optional ``id:``, one ``data:`` line of JSON)."""
    head = f"event: {event}\n" + (f"id: {event_id}\n" if event_id is not None else "")
    return (head + "data: " + json.dumps(data, separators=(",", ":"), default=str) + "\n\n").encode()


def end_event(job: JobDoc, event_id: int) -> bytes:
    """The last event of a stream; it repeats the id of the job's last event."""
    return sse("end", {"status": job["status"], "plan_id": job["plan_id"], "error": job["error"], "job": job},
               event_id)


def parse_last_event_id(header: str | None) -> int | None:
    """The ``Last-Event-ID`` a reconnecting client sends: a non-negative integer (above the
    largest id: no event is after it), else ignored."""
    value = (header or "").strip()
    if not value or not value.isascii() or not value.isdigit():
        return None
    return min(int(value), MAX_EVENT_ID)


def read_events(session_factory: Callable[[], Session], job_id: uuid.UUID,
                after: int | None) -> list[tuple[int, JobDoc]]:
    """The job's events after ``after``; ``None``: only its last one."""
    with session_factory() as s:
        repo = JobRepository(s)
        if after is None:
            last = repo.last_event(job_id)
            return [last] if last is not None else []
        return repo.events_after(job_id, after, EVENTS_PER_READ)


async def job_events(session_factory: Callable[[], Session], job_id: uuid.UUID, first: JobDoc,
                     disconnected: Callable[[], Awaitable[bool]], last_event_id: int | None = None,
                     poll_seconds: float = POLL_SECONDS,
                     keepalive_seconds: float = KEEPALIVE_SECONDS) -> AsyncIterator[bytes]:
    """The event stream of one job, from its history (``job_events``): without ``last_event_id``
    its state now (a ``status`` event), with it every event after that id; then each new event as
    it is recorded (``status`` when the status changed, else ``progress``), and a last ``end``
    once the job is finished, after which the stream closes. Each event's ``id`` is its history
    row's id (0: a job without history, its row as it is now)."""
    status: str | None = None
    cursor = last_event_id
    last_sent = time.monotonic()
    while True:
        rows = await run_in_threadpool(read_events, session_factory, job_id, cursor)
        if cursor is None and not rows:
            rows = [(0, first)]
        for event_id, doc in rows:
            yield sse("status" if doc["status"] != status else "progress", doc, event_id)
            status, cursor, last_sent = doc["status"], event_id, time.monotonic()
            if is_terminal(doc):
                yield end_event(doc, event_id)
                return
        if status is None and is_terminal(first):  # reconnected after the job's last event
            last = await run_in_threadpool(read_events, session_factory, job_id, None)
            yield end_event(first, last[0][0] if last else 0)
            return
        if len(rows) == EVENTS_PER_READ:
            continue
        if time.monotonic() - last_sent >= keepalive_seconds:
            yield b": keep-alive\n\n"
            last_sent = time.monotonic()
        await asyncio.sleep(poll_seconds)
        if await disconnected():
            return

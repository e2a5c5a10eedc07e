"""Watching a job change: the long poll (``GET /v1/jobs/{id}?wait=``) and the event stream
(``GET /v1/jobs/{id}/events``).

Both layouts write a job's progress on its row (the in-process executor and Celery workers alike,
at every heartbeat and at every new stage), so watching is reading that row every
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


def event_name(before: JobDoc | None, now: JobDoc) -> str:
    """``status`` when the status changed (or on the first event), else ``progress``."""
    return "status" if before is None or before["status"] != now["status"] else "progress"


async def job_events(session_factory: Callable[[], Session], job_id: uuid.UUID, first: JobDoc,
                     disconnected: Callable[[], Awaitable[bool]], poll_seconds: float = POLL_SECONDS,
                     keepalive_seconds: float = KEEPALIVE_SECONDS) -> AsyncIterator[bytes]:
    """The event stream of one job: its state now (``status``), then a ``status`` or ``progress``
    event at every change, and a last ``end`` event with the final status and plan id, after which
    the stream closes. Each event's data is the job document of ``GET /v1/jobs/{id}`` (``end``:
    ``{"status", "plan_id", "error", "job"}``)."""
    n = 0
    previous: JobDoc | None = None
    current = first
    last_sent = time.monotonic()
    while True:
        if previous is None or fingerprint(current) != fingerprint(previous):
            n += 1
            yield sse(event_name(previous, current), current, n)
            previous, last_sent = current, time.monotonic()
        if is_terminal(current):
            n += 1
            yield sse("end", {"status": current["status"], "plan_id": current["plan_id"],
                              "error": current["error"], "job": current}, n)
            return
        if time.monotonic() - last_sent >= keepalive_seconds:
            yield b": keep-alive\n\n"
            last_sent = time.monotonic()
        await asyncio.sleep(poll_seconds)
        if await disconnected():
            return
        latest = await run_in_threadpool(read_job, session_factory, job_id)
        if latest is None:
            return
        current = latest

"""What the sync and async clients share: settings, the retry rule, reading answers and events."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import httpx

from parplan.client.errors import ParplanError, UnreachableError, error_for

#: Answers worth another try: the service is shedding load or briefly unavailable.
RETRY_STATUSES = frozenset({429, 502, 503, 504})
#: Answers to the events stream after which a wait falls back to long polls.
FALLBACK_STATUSES = frozenset({405, 406, 429, 501})
TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
#: Seconds one long poll asks the server to wait (the server allows at most 60).
LONG_POLL_SECONDS = 25.0


@dataclass(frozen=True)
class ClientConfig:
    """Where the service is and how to talk to it. ``url`` and ``token`` default to the
    environment's ``PARPLAN_URL`` and ``PARPLAN_TOKEN``."""

    url: str
    token: str | None
    timeout_seconds: float = 30.0
    retries: int = 4
    backoff_seconds: float = 0.5
    max_backoff_seconds: float = 10.0

    @staticmethod
    def create(url: str | None = None, token: str | None = None, **more: Any) -> ClientConfig:
        resolved = url or os.environ.get("PARPLAN_URL")
        if not resolved:
            raise ParplanError("no service URL: pass url= or set PARPLAN_URL (e.g. http://127.0.0.1:8000)")
        tok = token if token is not None else os.environ.get("PARPLAN_TOKEN") or None
        return ClientConfig(url=resolved.rstrip("/"), token=tok, **more)

    def headers(self) -> dict[str, str]:
        h = {"Accept": "application/json", "User-Agent": "parplan-client"}
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        return h

    def timeout(self) -> httpx.Timeout:
        return httpx.Timeout(self.timeout_seconds)

    def delay(self, attempt: int, response: httpx.Response | None) -> float:
        """Seconds before retry ``attempt`` (0-based): the answer's Retry-After when it gives one,
        else exponential backoff with jitter."""
        if response is not None:
            after = response.headers.get("retry-after")
            if after is not None:
                try:
                    return min(max(0.0, float(after)), self.max_backoff_seconds)
                except ValueError:
                    pass
        base = min(self.backoff_seconds * 2.0**attempt, self.max_backoff_seconds)
        return base * (0.5 + random.random() / 2)


def should_retry(response: httpx.Response) -> bool:
    return response.status_code in RETRY_STATUSES


def problem_of(response: httpx.Response) -> dict[str, Any]:
    try:
        doc = response.json()
    except ValueError:
        return {"detail": response.text[:500] or f"HTTP {response.status_code}"}
    return doc if isinstance(doc, dict) else {"detail": str(doc)}


def checked(response: httpx.Response) -> dict[str, Any]:
    """The JSON body of a success; the typed error of a failure."""
    if response.is_success:
        body = response.json()
        return body if isinstance(body, dict) else {"value": body}
    raise error_for(response.status_code, problem_of(response))


class EventParser:
    """Server-Sent Events from lines: feed lines, get ``(event, data)`` pairs (data parsed as JSON)."""

    def __init__(self) -> None:
        self._event = "message"
        self._data: list[str] = []
        #: The ``id`` of the last event with one (what a reconnect sends as ``Last-Event-ID``).
        self.last_id: str | None = None
        self._id: str | None = None

    def restart(self) -> None:
        """A new connection: drop the half-read event a broken one left (keep ``last_id``)."""
        self._event, self._data, self._id = "message", [], None

    def feed(self, lines: Iterable[str]) -> list[tuple[str, dict[str, Any]]]:
        out = []
        for line in lines:
            if line == "":
                if self._data:
                    out.append((self._event, json.loads("\n".join(self._data))))
                    if self._id is not None:
                        self.last_id = self._id
                self._event, self._data, self._id = "message", [], None
            elif line.startswith(":"):
                continue
            elif line.startswith("event:"):
                self._event = line[6:].strip()
            elif line.startswith("id:"):
                self._id = line[3:].strip()
            elif line.startswith("data:"):
                self._data.append(line[5:].lstrip(" "))
        return out


def job_of_event(event: str, data: dict[str, Any]) -> dict[str, Any] | None:
    """The job document an event carries (``end`` wraps it), or None for other events."""
    if event == "end":
        job = data.get("job")
        return job if isinstance(job, dict) else None
    return data if event in ("status", "progress") else None


class Follow:
    """A wait's place in a job's event stream across reconnects: the last job seen, the parser
    (which knows the last event id), and the reconnects in a row that brought no event."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.job: dict[str, Any] | None = None
        self.parser = EventParser()
        self.failures = 0
        self.events = 0  # events received since the last (re)connect
        self.error: Exception | None = None  # the transport error that broke the last stream

    def headers(self) -> dict[str, str]:
        h = {"Accept": "text/event-stream"}
        if self.parser.last_id is not None:
            h["Last-Event-ID"] = self.parser.last_id
        return h

    def connected(self) -> None:
        self.events, self.error = 0, None
        self.parser.restart()

    def ended(self) -> bool:
        return self.job is not None and self.job["status"] in TERMINAL

    def reconnect_delay(self, config: ClientConfig) -> float | None:
        """After a stream closed before ``end``: seconds to wait before reconnecting with
        ``Last-Event-ID``, or None to go on with long polls (no event id yet, or ``retries``
        reconnects in a row brought nothing while the server kept answering). Raises
        UnreachableError when they failed on the connection itself."""
        if self.parser.last_id is None:
            return None
        self.failures = 0 if self.events else self.failures + 1
        if self.failures > config.retries:
            if self.error is None:
                return None
            raise UnreachableError(f"events of job {self.job_id}: the stream broke and {config.retries} reconnects "
                                   f"failed ({self.error.__class__.__name__}: {self.error})") from self.error
        return config.delay(max(0, self.failures - 1), None)

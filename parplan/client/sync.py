"""The blocking client: :class:`Client`."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from parplan.client.core import (
    FALLBACK_STATUSES,
    LONG_POLL_SECONDS,
    TERMINAL,
    ClientConfig,
    Follow,
    checked,
    job_of_event,
    problem_of,
    should_retry,
)
from parplan.client.errors import (
    JobCancelledError,
    JobFailedError,
    ParplanError,
    UnreachableError,
    WaitTimeoutError,
    error_for,
)

ProgressCallback = Callable[[dict[str, Any]], None]


class Client:
    """A parplan service over HTTP. Every call has a timeout; 429, 502-504 and connection errors are
    retried with backoff (``Retry-After`` honoured; a repeated ``POST /v1/plans`` is harmless: the
    service joins an identical request to the job already made for it); errors raise
    :class:`ApiError` subclasses built from the problem document. Use as a context manager, or call
    :meth:`close`.

    >>> with Client("http://127.0.0.1:8000", token) as c:     # doctest: +SKIP
    ...     plan = c.plan_and_wait({"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": 8}})
    """

    def __init__(self, url: str | None = None, token: str | None = None, *, timeout: float = 30.0,
                 retries: int = 4, backoff: float = 0.5, http: httpx.Client | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.config = ClientConfig.create(url, token, timeout_seconds=timeout, retries=retries,
                                          backoff_seconds=backoff)
        self._own = http is None
        self.http = http or httpx.Client(base_url=self.config.url, timeout=self.config.timeout())
        self.http.headers.update(self.config.headers())
        self._sleep = sleep

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._own:
            self.http.close()

    # -- transport --------------------------------------------------------------------------------
    def _request(self, method: str, path: str, *, timeout: float | None = None, **kw: Any) -> httpx.Response:
        last: Exception | None = None
        for attempt in range(self.config.retries + 1):
            response = None
            try:
                response = self.http.request(method, path, timeout=timeout or self.config.timeout_seconds, **kw)
            except httpx.TransportError as e:  # connection refused or reset, timeouts
                last = e
            else:
                if not should_retry(response) or attempt == self.config.retries:
                    return response
            if attempt < self.config.retries:
                self._sleep(self.config.delay(attempt, response))
        raise UnreachableError(f"{method} {self.config.url}{path}: {last.__class__.__name__}: {last}") from last

    def _json(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        return checked(self._request(method, path, **kw))

    # -- the API ----------------------------------------------------------------------------------
    def submit(self, request: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1/plans``: ``{"job", "plan", "cached"}`` (``plan`` set when it was cached)."""
        return self._json("POST", "/v1/plans", json=request)

    def job(self, job_id: str, wait: float | None = None) -> dict[str, Any]:
        params = {"wait": wait} if wait else None
        extra = (wait or 0) + self.config.timeout_seconds
        job: dict[str, Any] = self._json("GET", f"/v1/jobs/{job_id}", params=params, timeout=extra)["job"]
        return job

    def cancel(self, job_id: str) -> dict[str, Any]:
        job: dict[str, Any] = self._json("POST", f"/v1/jobs/{job_id}/cancel")["job"]
        return job

    def plan(self, plan_id: str) -> dict[str, Any]:
        return self._json("GET", f"/v1/plans/{plan_id}")

    def export(self, plan_id: str, target: str) -> dict[str, Any]:
        """The plan as ``target``'s files and launch lines (``files``, ``launch``, ``notes``, ``version``)."""
        return self._json("GET", f"/v1/plans/{plan_id}/export", params={"target": target})

    def wait(self, job_id: str, *, timeout: float | None = None, on_progress: ProgressCallback | None = None,
             use_events: bool = True) -> dict[str, Any]:
        """Follow the job until it ends (its events; long polls when the stream is unavailable or
        breaks) and return it succeeded. Raises JobFailedError, JobCancelledError, or WaitTimeoutError after
        ``timeout`` seconds (None: no limit)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        job: dict[str, Any] | None = None
        if use_events:
            job = self._follow_events(job_id, deadline, on_progress)
        while job is None or job["status"] not in TERMINAL:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise WaitTimeoutError(f"job {job_id} did not finish within {timeout:g} s", job)
            job = self.job(job_id, wait=min(LONG_POLL_SECONDS, left) if left is not None else LONG_POLL_SECONDS)
            if on_progress is not None:
                on_progress(job)
        return succeeded(job)

    def _follow_events(self, job_id: str, deadline: float | None,
                       on_progress: ProgressCallback | None) -> dict[str, Any] | None:
        """The job's last state from its event stream, reconnecting with ``Last-Event-ID`` when
        the stream breaks; None when the caller should go on with long polls (no stream, or
        one that keeps closing early). API errors other than 5xx propagate."""
        follow = Follow(job_id)
        while True:
            if not self._read_events(follow, deadline, on_progress):
                return None
            if follow.ended():
                return follow.job
            pause = follow.reconnect_delay(self.config)
            if pause is None:
                return None
            if deadline is not None and time.monotonic() + pause > deadline:
                raise WaitTimeoutError(f"job {job_id} did not finish in time", follow.job)
            self._sleep(pause)

    def _read_events(self, follow: Follow, deadline: float | None, on_progress: ProgressCallback | None) -> bool:
        """Read one connection of the stream into ``follow``; False when the server has no stream."""
        job_id = follow.job_id
        read = self.config.timeout_seconds + 20.0  # the server sends a keep-alive every 15 s
        if deadline is not None:
            read = max(0.1, min(read, deadline - time.monotonic()))
        follow.connected()
        try:
            with self.http.stream("GET", f"/v1/jobs/{job_id}/events", headers=follow.headers(),
                                  timeout=httpx.Timeout(self.config.timeout_seconds, read=read)) as r:
                if not r.is_success:
                    r.read()
                    if r.status_code == 404:
                        self.job(job_id)  # NotFoundError if there is no such job; else a server without events
                        return False
                    if r.status_code in FALLBACK_STATUSES or r.status_code >= 500:
                        return False
                    raise error_for(r.status_code, problem_of(r))
                for line in r.iter_lines():
                    for event, data in follow.parser.feed([line]):
                        found = job_of_event(event, data)
                        if found is not None:
                            follow.job, follow.events = found, follow.events + 1
                            if on_progress is not None and event != "end":
                                on_progress(found)
                    if deadline is not None and time.monotonic() > deadline:
                        raise WaitTimeoutError(f"job {job_id} did not finish in time", follow.job)
        except httpx.TransportError as e:
            follow.error = e
        return True

    def capacity(self, request: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1/capacity``: ``{"job", "result_url"}`` (the result is readable at once, partial)."""
        return self._json("POST", "/v1/capacity", json=request)

    def replan(self, request: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1/replan``: ``{"job", "result_url"}``."""
        return self._json("POST", "/v1/replan", json=request)

    def result(self, result_url: str) -> dict[str, Any]:
        """A capacity or replan result document (``result_url`` of the submission or the job)."""
        return self._json("GET", result_url)

    def sweep_and_wait(self, kind: str, request: dict[str, Any], *, timeout: float | None = None,
                       on_progress: ProgressCallback | None = None) -> dict[str, Any]:
        """Submit a ``capacity`` or ``replan`` request, follow its job, return the result document."""
        submitted = (self.capacity(request) if kind == "capacity" else self.replan(request))
        self.wait(submitted["job"]["id"], timeout=timeout, on_progress=on_progress)
        return self.result(submitted["result_url"])

    def plan_and_wait(self, request: dict[str, Any], *, timeout: float | None = None,
                      on_progress: ProgressCallback | None = None) -> dict[str, Any]:
        """Submit, wait, and return the plan document."""
        submitted = self.submit(request)
        if submitted.get("plan") is not None:
            plan: dict[str, Any] = submitted["plan"]
            return plan
        job = self.wait(submitted["job"]["id"], timeout=timeout, on_progress=on_progress)
        return self.plan(job["plan_id"])


def succeeded(job: dict[str, Any]) -> dict[str, Any]:
    if job["status"] == "failed":
        raise JobFailedError(job)
    if job["status"] == "cancelled":
        raise JobCancelledError(job)
    if job["status"] != "succeeded":
        raise ParplanError(f"job {job.get('id')} is {job['status']}")
    return job

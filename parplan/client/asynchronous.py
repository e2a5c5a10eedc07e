"""The asyncio client: :class:`AsyncClient`, the same calls as :class:`~parplan.client.Client`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
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
from parplan.client.errors import UnreachableError, WaitTimeoutError, error_for
from parplan.client.sync import ProgressCallback, succeeded


class AsyncClient:
    """A parplan service over HTTP, for asyncio code (orchestrators with many jobs in flight).
    Same timeouts, retries and typed errors as :class:`~parplan.client.Client`."""

    def __init__(self, url: str | None = None, token: str | None = None, *, timeout: float = 30.0,
                 retries: int = 4, backoff: float = 0.5, http: httpx.AsyncClient | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.config = ClientConfig.create(url, token, timeout_seconds=timeout, retries=retries,
                                          backoff_seconds=backoff)
        self._own = http is None
        self.http = http or httpx.AsyncClient(base_url=self.config.url, timeout=self.config.timeout())
        self.http.headers.update(self.config.headers())
        self._sleep = sleep

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._own:
            await self.http.aclose()

    async def _request(self, method: str, path: str, *, timeout: float | None = None, **kw: Any) -> httpx.Response:
        last: Exception | None = None
        for attempt in range(self.config.retries + 1):
            response = None
            try:
                response = await self.http.request(method, path, timeout=timeout or self.config.timeout_seconds,
                                                   **kw)
            except httpx.TransportError as e:
                last = e
            else:
                if not should_retry(response) or attempt == self.config.retries:
                    return response
            if attempt < self.config.retries:
                await self._sleep(self.config.delay(attempt, response))
        raise UnreachableError(f"{method} {self.config.url}{path}: {last.__class__.__name__}: {last}") from last

    async def _json(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        return checked(await self._request(method, path, **kw))

    async def submit(self, request: dict[str, Any]) -> dict[str, Any]:
        return await self._json("POST", "/v1/plans", json=request)

    async def job(self, job_id: str, wait: float | None = None) -> dict[str, Any]:
        params = {"wait": wait} if wait else None
        body = await self._json("GET", f"/v1/jobs/{job_id}", params=params,
                                timeout=(wait or 0) + self.config.timeout_seconds)
        job: dict[str, Any] = body["job"]
        return job

    async def cancel(self, job_id: str) -> dict[str, Any]:
        job: dict[str, Any] = (await self._json("POST", f"/v1/jobs/{job_id}/cancel"))["job"]
        return job

    async def plan(self, plan_id: str) -> dict[str, Any]:
        return await self._json("GET", f"/v1/plans/{plan_id}")

    async def export(self, plan_id: str, target: str) -> dict[str, Any]:
        return await self._json("GET", f"/v1/plans/{plan_id}/export", params={"target": target})

    async def wait(self, job_id: str, *, timeout: float | None = None, on_progress: ProgressCallback | None = None,
                   use_events: bool = True) -> dict[str, Any]:
        """As :meth:`parplan.client.Client.wait`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        job: dict[str, Any] | None = None
        if use_events:
            job = await self._follow_events(job_id, deadline, on_progress)
        while job is None or job["status"] not in TERMINAL:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise WaitTimeoutError(f"job {job_id} did not finish within {timeout:g} s", job)
            job = await self.job(job_id, wait=min(LONG_POLL_SECONDS, left) if left is not None else LONG_POLL_SECONDS)
            if on_progress is not None:
                on_progress(job)
        return succeeded(job)

    async def _follow_events(self, job_id: str, deadline: float | None,
                             on_progress: ProgressCallback | None) -> dict[str, Any] | None:
        """As :meth:`parplan.client.Client._follow_events`."""
        follow = Follow(job_id)
        while True:
            if not await self._read_events(follow, deadline, on_progress):
                return None
            if follow.ended():
                return follow.job
            pause = follow.reconnect_delay(self.config)
            if pause is None:
                return None
            if deadline is not None and time.monotonic() + pause > deadline:
                raise WaitTimeoutError(f"job {job_id} did not finish in time", follow.job)
            await self._sleep(pause)

    async def _read_events(self, follow: Follow, deadline: float | None,
                           on_progress: ProgressCallback | None) -> bool:
        job_id = follow.job_id
        read = self.config.timeout_seconds + 20.0
        if deadline is not None:
            read = max(0.1, min(read, deadline - time.monotonic()))
        follow.connected()
        try:
            async with self.http.stream("GET", f"/v1/jobs/{job_id}/events", headers=follow.headers(),
                                        timeout=httpx.Timeout(self.config.timeout_seconds, read=read)) as r:
                if not r.is_success:
                    await r.aread()
                    if r.status_code == 404:
                        await self.job(job_id)
                        return False
                    if r.status_code in FALLBACK_STATUSES or r.status_code >= 500:
                        return False
                    raise error_for(r.status_code, problem_of(r))
                async for line in r.aiter_lines():
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

    async def capacity(self, request: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1/capacity``: ``{"job", "result_url"}`` (the result is readable at once, partial)."""
        return await self._json("POST", "/v1/capacity", json=request)

    async def replan(self, request: dict[str, Any]) -> dict[str, Any]:
        """``POST /v1/replan``: ``{"job", "result_url"}``."""
        return await self._json("POST", "/v1/replan", json=request)

    async def result(self, result_url: str) -> dict[str, Any]:
        """A capacity or replan result document (``result_url`` of the submission or the job)."""
        return await self._json("GET", result_url)

    async def sweep_and_wait(self, kind: str, request: dict[str, Any], *, timeout: float | None = None,
                       on_progress: ProgressCallback | None = None) -> dict[str, Any]:
        """Submit a ``capacity`` or ``replan`` request, follow its job, return the result document."""
        submitted = await (self.capacity(request) if kind == "capacity" else self.replan(request))
        await self.wait(submitted["job"]["id"], timeout=timeout, on_progress=on_progress)
        return await self.result(submitted["result_url"])

    async def plan_and_wait(self, request: dict[str, Any], *, timeout: float | None = None,
                            on_progress: ProgressCallback | None = None) -> dict[str, Any]:
        submitted = await self.submit(request)
        if submitted.get("plan") is not None:
            plan: dict[str, Any] = submitted["plan"]
            return plan
        job = await self.wait(submitted["job"]["id"], timeout=timeout, on_progress=on_progress)
        return await self.plan(job["plan_id"])

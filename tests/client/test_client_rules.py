"""The client's rules on a scripted transport (httpx.MockTransport): what it retries and how long it
waits, the typed errors it builds from problem documents, and how a wait falls back from the
event stream to long polls. The same calls against a real service are in test_client_service.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from parplan.client import (
    AsyncClient,
    Client,
    InvalidRequestError,
    JobFailedError,
    NotFoundError,
    RateLimitedError,
    UnreachableError,
    WaitTimeoutError,
)
from parplan.client.core import EventParser

URL = "http://parplan.test"
Handler = Callable[[httpx.Request], httpx.Response]


def _job(status: str, stage: str = "search", fraction: float = 0.5, **more: Any) -> dict[str, Any]:
    return {"id": "j1", "status": status, "progress": {"stage": stage, "fraction": fraction}, "plan_id": None,
            "error": None, "cancel_requested": False} | more


def _problem(status: int, detail: str, **more: Any) -> httpx.Response:
    return httpx.Response(status, json={"type": "about:blank", "title": "t", "status": status, "detail": detail,
                                        **more}, headers={"content-type": "application/problem+json"})


def _client(handler: Handler, **kw: Any) -> tuple[Client, list[float]]:
    slept: list[float] = []
    http = httpx.Client(base_url=URL, transport=httpx.MockTransport(handler))
    return Client(URL, "tok", http=http, sleep=slept.append, **kw), slept


def _script(*answers: httpx.Response | Exception) -> tuple[Handler, list[httpx.Request]]:
    seen: list[httpx.Request] = []
    it: Iterator[httpx.Response | Exception] = iter(answers)

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        a = next(it)
        if isinstance(a, Exception):
            raise a
        return a
    return handler, seen


def test_503_and_429_are_retried_honouring_retry_after() -> None:
    handler, seen = _script(_problem(503, "busy"), _problem(429, "slow down"), httpx.Response(200, json={"a": 1}))
    c, slept = _client(handler, backoff=0.2)
    assert c.plan("p1") == {"a": 1}
    assert len(seen) == 3 and all(r.headers["authorization"] == "Bearer tok" for r in seen)
    assert 0.1 <= slept[0] <= 0.2 and 0.2 <= slept[1] <= 0.4  # backoff with jitter, doubling

    handler, _ = _script(httpx.Response(429, json={"detail": "x"}, headers={"retry-after": "3"}),
                         httpx.Response(200, json={}))
    c, slept = _client(handler)
    c.plan("p1")
    assert slept == [3.0]


def test_retries_run_out_into_typed_errors() -> None:
    handler, seen = _script(*[_problem(429, "slow down")] * 3)
    c, slept = _client(handler, retries=2)
    with pytest.raises(RateLimitedError) as e:
        c.plan("p1")
    assert e.value.status == 429 and e.value.detail == "slow down" and len(seen) == 3 and len(slept) == 2

    handler, seen = _script(*[httpx.ConnectError("refused")] * 3)
    c, _ = _client(handler, retries=2)
    with pytest.raises(UnreachableError, match="ConnectError"):
        c.submit({})
    assert len(seen) == 3


def test_client_errors_are_not_retried_and_keep_the_problem() -> None:
    errors = [{"loc": ["body", "cluster", "gpus"], "field": "cluster.gpus", "message": "must be >= 1"}]
    handler, seen = _script(_problem(422, "cluster.gpus: must be >= 1", errors=errors), _problem(404, "no plan x"))
    c, slept = _client(handler)
    with pytest.raises(InvalidRequestError) as e:
        c.submit({"cluster": {"gpus": 0}})
    assert e.value.errors == errors and e.value.problem["status"] == 422 and slept == []
    with pytest.raises(NotFoundError, match="no plan x"):
        c.plan("x")
    assert len(seen) == 2


def _sse(*events: tuple[str, dict[str, Any]], cut: bool = False, first_id: int | None = None) -> httpx.Response:
    ids = [""] * len(events) if first_id is None else [f"id: {first_id + k}\n" for k in range(len(events))]
    text = "".join(f"event: {e}\n{i}data: {json.dumps(d)}\n\n" for (e, d), i in zip(events, ids, strict=True))
    if cut:  # the stream breaks in the middle of an event
        text += "event: progress\ndata: {\"id\""
    return httpx.Response(200, content=text.encode(), headers={"content-type": "text/event-stream"})


def test_wait_follows_the_events_to_the_end() -> None:
    done = _job("succeeded", "done", 1.0, plan_id="p1")
    handler, seen = _script(_sse(("status", _job("running")), ("progress", _job("running", "search", 0.7)),
                                 ("status", done), ("end", {"status": "succeeded", "plan_id": "p1", "job": done})))
    c, _ = _client(handler)
    progress: list[float] = []
    assert c.wait("j1", on_progress=lambda j: progress.append(j["progress"]["fraction"])) == done
    assert progress == [0.5, 0.7, 1.0] and [r.url.path for r in seen] == ["/v1/jobs/j1/events"]


def test_wait_falls_back_to_long_polls() -> None:
    # No events endpoint (an older server or a proxy): long polls with ?wait=.
    handler, seen = _script(_problem(501, "no streaming"), httpx.Response(200, json={"job": _job("running")}),
                            httpx.Response(200, json={"job": _job("succeeded", plan_id="p1")}))
    c, _ = _client(handler)
    assert c.wait("j1")["plan_id"] == "p1"
    assert [r.url.params.get("wait") for r in seen[1:]] == ["25.0", "25.0"]
    # A stream that breaks before the end: the wait goes on with long polls.
    handler, seen = _script(_sse(("status", _job("running")), cut=True),
                            httpx.Response(200, json={"job": _job("failed", error={"code": "unsolvable",
                                                                                     "message": "no fit"})}))
    c, _ = _client(handler)
    with pytest.raises(JobFailedError) as e:
        c.wait("j1")
    assert e.value.code == "unsolvable" and len(seen) == 2


def test_a_broken_stream_resumes_with_last_event_id() -> None:
    done = _job("succeeded", "done", 1.0, plan_id="p1")
    handler, seen = _script(_sse(("status", _job("running")), ("progress", _job("running", "search", 0.7)),
                                 first_id=7, cut=True),
                            _sse(("status", done), ("end", {"status": "succeeded", "job": done}), first_id=9))
    c, slept = _client(handler)
    assert c.wait("j1") == done
    assert [r.headers.get("last-event-id") for r in seen] == [None, "8"] and len(slept) == 1


def test_reconnects_that_cannot_connect_end_in_unreachable() -> None:
    handler, seen = _script(_sse(("status", _job("running")), first_id=3, cut=True),
                            *[httpx.ConnectError("refused")] * 3)
    c, slept = _client(handler, retries=2)
    with pytest.raises(UnreachableError, match=r"2 reconnects failed.*ConnectError"):
        c.wait("j1")
    assert len(seen) == 4 and len(slept) == 3
    assert all(r.headers["last-event-id"] == "3" for r in seen[1:])


def test_the_async_client_resumes_alike() -> None:
    done = _job("succeeded", "done", 1.0, plan_id="p1")
    handler, seen = _script(_sse(("status", _job("running")), first_id=4, cut=True),
                            _sse(("status", done), ("end", {"status": "succeeded", "job": done}), first_id=5))

    async def run() -> dict[str, Any]:
        async def sleep(_: float) -> None:
            return None
        http = httpx.AsyncClient(base_url=URL, transport=httpx.MockTransport(handler))
        async with AsyncClient(URL, "tok", http=http, sleep=sleep) as c:
            job = await c.wait("j1")
        await http.aclose()
        return job
    assert asyncio.run(run()) == done
    assert [r.headers.get("last-event-id") for r in seen] == [None, "4"]


def test_a_missing_job_is_not_found_not_a_fallback() -> None:
    handler, seen = _script(_problem(404, "no job j1"), _problem(404, "no job j1"))
    c, _ = _client(handler)
    with pytest.raises(NotFoundError):
        c.wait("j1")
    assert len(seen) == 2


def test_wait_gives_up_after_its_timeout() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/events"):
            return _problem(501, "none")
        return httpx.Response(200, json={"job": _job("running")})
    c, _ = _client(handler)
    with pytest.raises(WaitTimeoutError) as e:
        c.wait("j1", timeout=0.2)
    assert e.value.job is not None and e.value.job["status"] == "running"


def test_the_async_client_retries_and_types_errors_alike() -> None:
    handler, seen = _script(_problem(503, "busy"), _problem(422, "bad", errors=[{"field": "model"}]))
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)

    async def run() -> None:
        http = httpx.AsyncClient(base_url=URL, transport=httpx.MockTransport(handler))
        async with AsyncClient(URL, "tok", http=http, sleep=sleep) as c:
            with pytest.raises(InvalidRequestError) as e:
                await c.submit({})
            assert e.value.errors == [{"field": "model"}]
        await http.aclose()
    asyncio.run(run())
    assert len(seen) == 2 and len(slept) == 1


def test_event_parser_joins_data_lines_and_skips_comments() -> None:
    p = EventParser()
    assert p.feed([": keep-alive", "", "event: status", 'data: {"a":', "data: 1}"]) == []
    assert p.feed(["", "data: {}", ""]) == [("status", {"a": 1}), ("message", {})]
    assert p.last_id is None
    assert p.feed(["event: status", "id: 12", "data: {}", "", "data: {}", ""]) == [("status", {}), ("message", {})]
    assert p.last_id == "12"  # an event without an id keeps the last one


def test_the_url_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PARPLAN_URL", raising=False)
    with pytest.raises(Exception, match="PARPLAN_URL"):
        Client()
    monkeypatch.setenv("PARPLAN_URL", "http://h:1/")
    monkeypatch.setenv("PARPLAN_TOKEN", "secret")
    with Client() as c:
        assert c.config.url == "http://h:1" and c.http.headers["authorization"] == "Bearer secret"

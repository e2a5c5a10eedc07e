"""Prometheus metrics: HTTP requests (counted and timed per route), and — read from the
database at scrape time, so they cover every worker process — jobs by status, queue depth and a
histogram of solve times."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy.orm import Session

from parplan.service.jobs.repository import JobRepository
from parplan.service.models import JobStatus
from parplan.service.queue import JobQueue

log = logging.getLogger("parplan.service")

SOLVE_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
Scope = dict[str, Any]
ASGIApp = Callable[..., Any]


class _StateCollector(Collector):
    def __init__(self, session_factory: Callable[[], Session], queue: JobQueue) -> None:
        self.session_factory = session_factory
        self.queue = queue

    def collect(self) -> Iterator[Metric]:
        jobs = GaugeMetricFamily("parplan_jobs", "Jobs by status.", labels=["status"])
        try:
            with self.session_factory() as s:
                repo = JobRepository(s)
                counts = repo.count_by_status()
                buckets, total, n = repo.solve_time_histogram(SOLVE_BUCKETS)
        except Exception as e:
            log.warning("metrics: database unavailable (%s)", e.__class__.__name__)
            return
        for st in JobStatus:
            jobs.add_metric([st.value], counts.get(st.value, 0))
        yield jobs
        depth = self.queue.depth()
        if depth is not None:
            yield GaugeMetricFamily("parplan_queue_depth", "Jobs waiting in the queue (broker messages).",
                                    value=depth)
        hist = HistogramMetricFamily("parplan_solve_seconds", "Wall-clock time of finished solves.")
        points: list[tuple[str, float]] = [(repr(b), float(c)) for b, c in zip(SOLVE_BUCKETS, buckets, strict=True)]
        hist.add_metric([], [*points, ("+Inf", float(n))], sum_value=total)
        yield hist


class Metrics:
    """One registry per app (tests build several apps in one process)."""

    def __init__(self, session_factory: Callable[[], Session], queue: JobQueue) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("parplan_http_requests", "HTTP requests.", ["method", "route", "status"],
                                registry=self.registry)
        self.latency = Histogram("parplan_http_request_duration_seconds", "HTTP request latency.",
                                 ["method", "route"], registry=self.registry,
                                 buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0))
        self.registry.register(_StateCollector(session_factory, queue))


class MetricsMiddleware:
    """Pure ASGI: counts and times each request by its route template (bounded label values)."""

    def __init__(self, app: ASGIApp, metrics: Callable[[], Metrics | None]) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = [500]

        async def send_wrapper(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            m = self.metrics()
            if m is not None:
                route = getattr(scope.get("route"), "path", None) or "unmatched"
                m.requests.labels(scope["method"], route, str(status[0])).inc()
                m.latency.labels(scope["method"], route).observe(time.perf_counter() - start)

"""What a running API process holds: settings, the database engine and session factory, the
job queue, the token verifier, metrics, and the sweeper thread."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from parplan.service.auth.service import TokenVerifier
from parplan.service.caching import LRU, TTLCache
from parplan.service.database import make_engine, make_session_factory
from parplan.service.dispatch import Dispatcher
from parplan.service.health.metrics import Metrics
from parplan.service.overload import RateLimiter
from parplan.service.queue import JobQueue, QueueFactory
from parplan.service.settings import Settings
from parplan.service.shared_rate_limit import make_rate_limiter
from parplan.service.sweeper import SweeperThread

log = logging.getLogger("parplan.service")


class Wakeup:
    """Wakes long-polling claimers in this process when a validation is queued (other
    processes' validations are found by polling)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None

    def bind(self) -> asyncio.Event:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._event is None:
            self._loop, self._event = loop, asyncio.Event()
        return self._event

    def notify(self) -> None:
        loop, event = self._loop, self._event
        if loop is not None and event is not None and not loop.is_closed():
            loop.call_soon_threadsafe(event.set)


@dataclass
class Runtime:
    settings: Settings
    session_factory: Callable[[], Session]
    queue: JobQueue
    engine: Engine | None = None
    verifier: TokenVerifier = field(default_factory=TokenVerifier)
    wakeup: Wakeup = field(default_factory=Wakeup)
    metrics: Metrics | None = None
    run_sweeper: bool = True
    #: Finished plan responses by cache key (immutable; see parplan.service.caching).
    plan_responses: LRU[str, bytes] = field(default_factory=lambda: LRU(512))
    #: Latest calibration per GPU preset, remembered briefly.
    calibrations: TTLCache[str, dict[str, Any] | None] = field(default_factory=lambda: TTLCache(1.0))
    #: Requests per token and second (None: no limit; PARPLAN_RATE_LIMIT_PER_SECOND).
    rate_limiter: RateLimiter | None = None
    _sweeper: SweeperThread | None = None

    def __post_init__(self) -> None:
        if self.metrics is None:
            self.metrics = Metrics(self.session_factory, self.queue)
        if self.rate_limiter is None:
            self.rate_limiter = make_rate_limiter(self.settings)

    @staticmethod
    def create(settings: Settings, make_queue: QueueFactory) -> Runtime:
        """A runtime whose jobs go to the queue ``make_queue`` builds (the workers' factory), behind
        a fair :class:`~parplan.service.dispatch.Dispatcher` when that queue is first come, first served."""
        if settings.embedded:
            settings.data_dir.mkdir(parents=True, exist_ok=True)
        engine = make_engine(settings.resolved_database_url)
        sf = make_session_factory(engine)
        queue = make_queue(settings, sf)
        if not queue.fair and settings.dispatch_window > 0:
            queue = Dispatcher(queue, sf, settings)
        return Runtime(settings=settings, session_factory=sf, queue=queue, engine=engine,
                       run_sweeper=settings.sweeper)

    def start(self) -> None:
        self.queue.start()
        if self.run_sweeper and self._sweeper is None:
            self._sweeper = SweeperThread(self.session_factory, self.queue, self.settings)
            self._sweeper.start()

    def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.stop()
            self._sweeper.join(timeout=10)
            self._sweeper = None
        self.queue.close()
        if self.rate_limiter is not None:
            self.rate_limiter.close()
        if self.engine is not None:
            self.engine.dispose()

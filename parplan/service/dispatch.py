"""Fair scheduling in front of a first-come-first-served broker (the Celery layout).

Celery over Redis serves one list in order, so a token that queues a thousand jobs holds back
everyone who comes after it. The :class:`Dispatcher` keeps that list short: it holds at most
``dispatch_window`` messages, and the other queued jobs wait in the database. Each pass tops the
list up with waiting jobs chosen by :func:`fair_order`: the token with the fewest jobs running or
already handed over goes first, ties to the token served longest ago (round robin; the turns are
kept in Redis, shared by every process that dispatches), so a newcomer's job is among the next
``dispatch_window`` to start however long another token's backlog is.

Who runs the passes: each API process (a thread: at once after a new job, when the window has
room, and every ``dispatch_interval_seconds``) and, in the Celery layout, every worker as it
starts a task (:func:`parplan.workers.tasks.top_up`): a worker that takes a message off the list
refills it at once, so during a burst the window is nearly always full and the API process's
passes stop at one ``LLEN`` — the database queries and the messages are the workers' work, off
the API's event loop and its GIL. Any number of processes may dispatch: one at a time (a Redis
lock), with the round-robin turns kept in Redis beside the lock.

State is the database's, as everywhere: a queued job with no ``enqueued_at`` is *waiting*; one
with ``enqueued_at`` was handed to the broker then. Nothing is lost on a crash: a job is marked
before its message is sent (a conditional UPDATE, so two dispatching processes never both send it), and a
job marked but never sent, or whose message Redis lost, counts as *missing* (marked jobs minus
messages in Redis); the sweeper puts the missing ones back among the waiting
(:meth:`Dispatcher.recover_lost`). A job never runs twice: workers claim jobs with a conditional
UPDATE, whatever the number of messages.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Callable, Hashable, Mapping, Sequence
from datetime import datetime
from typing import Any

import redis
from sqlalchemy.orm import Session

from parplan.service.database import utcnow
from parplan.service.jobs.repository import JobRepository
from parplan.service.queue import JobQueue
from parplan.service.settings import Settings

log = logging.getLogger("parplan.service")

Head = tuple[uuid.UUID, Hashable, datetime]  # a waiting job: id, its token, when it was created


def fair_order(waiting: Sequence[Head], in_flight: Mapping[Any, int], n: int,
               last_served: Mapping[Any, int] | None = None) -> list[uuid.UUID]:
    """The next ``n`` jobs to hand over. Each time: the token with the fewest jobs in flight
    (running or handed over, counting those already picked); among those, the one served longest
    ago (``last_served``: a turn number per token, larger is later; never served goes first); then
    the one with the oldest job. Its oldest waiting job is next. ``waiting`` holds each token's
    oldest jobs, in any order."""
    lanes: dict[Hashable, list[Head]] = {}
    for head in sorted(waiting, key=lambda h: (h[2], str(h[0]))):
        lanes.setdefault(head[1], []).append(head)
    load = {token: in_flight.get(token, 0) for token in lanes}
    served = {token: (last_served or {}).get(token, -1) for token in lanes}
    turn = max(served.values(), default=0) + 1
    out: list[uuid.UUID] = []
    while len(out) < n and lanes:
        token = min(lanes, key=lambda t: (load[t], served[t], lanes[t][0][2], str(lanes[t][0][0])))
        out.append(lanes[token].pop(0)[0])
        load[token] += 1
        served[token], turn = turn, turn + 1
        if not lanes[token]:
            del lanes[token]
    return out


class Dispatcher:
    """A :class:`~parplan.service.queue.JobQueue` that hands jobs to ``inner`` (a FIFO broker) a
    few at a time, in turn by token. ``enqueue`` only marks the job waiting and wakes the thread."""

    fair = True
    deduplicates = False

    def __init__(self, inner: JobQueue, session_factory: Callable[[], Session], settings: Settings) -> None:
        self.inner, self.session_factory, self.settings = inner, session_factory, settings
        self.kind = inner.kind
        self.window = settings.dispatch_window
        self._redis: Any = (redis.Redis.from_url(settings.broker_url, socket_connect_timeout=1, socket_timeout=2)
                            if settings.broker_url else None)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: token -> the turn it was last served in, when there is no Redis to share them in
        self._local_turns: dict[str, int] = {}

    # -- the JobQueue interface ---------------------------------------------------------------------
    def start(self) -> None:
        self.inner.start()
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="parplan-dispatch", daemon=True)
            self._thread.start()

    def enqueue(self, job_id: uuid.UUID) -> bool:
        """Mark the queued job waiting (it may have been handed over before) and wake the dispatcher."""
        try:
            with self.session_factory() as s:
                JobRepository(s).unsend([job_id])
                s.commit()
        except Exception as e:  # the job stays marked; the sweeper finds its message missing
            log.warning("could not mark job %s waiting (%s); the sweeper will", job_id, e.__class__.__name__)
            return False
        self._wake.set()
        return True

    def wake(self) -> None:
        """A new job is waiting (committed with no ``enqueued_at``): run a pass now."""
        self._wake.set()

    def depth(self) -> int | None:
        return self.inner.depth()

    def ping(self) -> bool:
        return self.inner.ping()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self.inner.close()
        if self._redis is not None:
            self._redis.close()

    # -- dispatching ----------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()  # before the pass: a job added during it wakes the next one at once
            try:
                self.dispatch_once()
            except Exception as e:
                log.warning("dispatch pass failed: %s: %s", e.__class__.__name__, e)
            self._wake.wait(self.settings.dispatch_interval_seconds)

    def dispatch_once(self, now: datetime | None = None) -> list[uuid.UUID]:
        """Top the broker's queue up to the window; the ids handed over."""
        depth = self.inner.depth()
        if depth is None or depth >= self.window:
            return []
        lock = self._redis.lock(f"{self.settings.queue_name}:dispatch", timeout=10) if self._redis else None
        if lock is not None and not lock.acquire(blocking=False):
            return []  # another process is dispatching
        try:
            depth = self.inner.depth()  # what that process may just have sent
            if depth is None or depth >= self.window:
                return []
            free = self.window - depth
            with self.session_factory() as s:
                jobs = JobRepository(s)
                heads = jobs.waiting_heads(free)
                if not heads:
                    return []
                turns = self._load_turns()
                owner = {h[0]: h[1] for h in heads}
                served = {token: turns[str(token)] for token in owner.values() if str(token) in turns}
                order = fair_order(heads, jobs.in_flight_by_token(), free, served)
                taken = jobs.mark_sent_all(order, now or utcnow())
                s.commit()
            sent = [job_id for job_id in order if job_id in taken]
            turn = max(turns.values(), default=0)
            self._save_turns({str(owner[job_id]): turn + i for i, job_id in enumerate(sent, start=1)})
            for i, job_id in enumerate(sent):
                if not self.inner.enqueue(job_id):  # the broker is down: they wait for the next pass
                    with self.session_factory() as s:
                        JobRepository(s).unsend(sent[i:])
                        s.commit()
                    return sent[:i]
            return sent
        finally:
            if lock is not None:
                with contextlib.suppress(redis.RedisError):  # expired: it was ours only for its timeout
                    lock.release()

    def _turns_key(self) -> str:
        return f"{self.settings.queue_name}:dispatch:turns"

    def _load_turns(self) -> dict[str, int]:
        """The turn each token was last served in (read under the dispatch lock). Lost turns (Redis
        restarted) only change the order among tokens with as many jobs in flight, never safety."""
        if self._redis is None:
            return dict(self._local_turns)
        try:
            raw = self._redis.hgetall(self._turns_key())
        except redis.RedisError:
            return {}
        return {k.decode(): int(v) for k, v in raw.items()}

    def _save_turns(self, turns: dict[str, int]) -> None:
        if not turns:
            return
        if self._redis is None:
            self._local_turns.update(turns)
            return
        with contextlib.suppress(redis.RedisError):  # a day idle forgets them (a tie-break, nothing more)
            self._redis.pipeline().hset(self._turns_key(), mapping=turns).expire(self._turns_key(), 86400).execute()

    def recover_lost(self, jobs: JobRepository, sent_before: datetime) -> list[uuid.UUID]:
        """The sweeper's part: put back among the waiting as many jobs handed over before
        ``sent_before`` as the broker is short of messages (the oldest first)."""
        depth = self.inner.depth()
        if depth is None:
            return []
        missing = jobs.count_sent() - depth
        if missing <= 0:
            return []
        stale = jobs.stale_sent(sent_before)
        return jobs.unsend(stale[:missing], sent_before) if stale else []

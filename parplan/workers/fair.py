"""A blocking queue that serves its owners in turn (round robin over per-owner lanes), so one
client's burst of jobs cannot starve another's: with A's ten jobs waiting, B's one job is the next
but one to start, not the eleventh."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class FairQueue(Generic[T]):
    def __init__(self) -> None:
        self._lanes: dict[Hashable, deque[T]] = {}
        self._turns: deque[Hashable] = deque()  # owners with waiting items, next to serve first
        self._cond = threading.Condition()
        self._closed = False

    def put(self, owner: Hashable, item: T) -> None:
        with self._cond:
            lane = self._lanes.get(owner)
            if lane is None:
                lane = self._lanes[owner] = deque()
                self._turns.append(owner)
            lane.append(item)
            self._cond.notify()

    def get(self, timeout: float | None = None) -> T | None:
        """The next owner's oldest item; None when closed or after ``timeout`` seconds with none."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._closed or bool(self._turns), timeout):
                return None
            if self._closed:
                return None
            owner = self._turns.popleft()
            lane = self._lanes[owner]
            item = lane.popleft()
            if lane:
                self._turns.append(owner)
            else:
                del self._lanes[owner]
            return item

    def __len__(self) -> int:
        with self._cond:
            return sum(len(lane) for lane in self._lanes.values())

    def close(self) -> None:
        """Wake every waiting :meth:`get` (which then returns None); waiting items are dropped."""
        with self._cond:
            self._closed = True
            self._lanes.clear()
            self._turns.clear()
            self._cond.notify_all()

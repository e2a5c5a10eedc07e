"""Small in-process caches for the hot read paths.

- :class:`LRU` holds finished plan responses by cache key. Safe without invalidation: a plan
  stored under a key never changes (the key covers the request, the solver version and the
  calibration), nor does the finished job that produced it.
- :class:`TTLCache` holds the latest calibration per GPU for a second or so: a new calibration
  applies to plan requests at most that long after it is stored.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class LRU(Generic[K, V]):
    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._data: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        if self.max_entries <= 0:
            return
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.max_entries:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


class TTLCache(Generic[K, V]):
    """``get_or_load(key, load)``: the remembered value if younger than ``ttl_seconds``."""

    def __init__(self, ttl_seconds: float, max_entries: int = 1024) -> None:
        self.ttl = ttl_seconds
        self.max_entries = max_entries
        self._data: dict[K, tuple[float, V]] = {}
        self._lock = threading.Lock()

    def peek(self, key: K) -> tuple[bool, V | None]:
        with self._lock:
            hit = self._data.get(key)
        if hit is not None and time.monotonic() - hit[0] < self.ttl:
            return True, hit[1]
        return False, None

    def put(self, key: K, value: V) -> None:
        with self._lock:
            if len(self._data) >= self.max_entries:
                self._data.clear()
            self._data[key] = (time.monotonic(), value)

    def get_or_load(self, key: K, load: Callable[[], V]) -> V:
        found, value = self.peek(key)
        if found:
            return value  # type: ignore[return-value]
        value = load()
        self.put(key, value)
        return value

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

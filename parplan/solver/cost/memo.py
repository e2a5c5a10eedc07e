"""A memo: values priced once per key, with the requests and the computations counted.

The evaluator's pricing functions (:mod:`.stage_memory`, :mod:`.stage_time`) are pure; what they
depend on is spelt out as the key (:mod:`.price_keys`), so a kept value is the one pricing afresh
gives. A disabled memo prices every request (the oracle tests compare a caching evaluator with).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

_MISSING: Any = object()


class Memo(Generic[K, V]):
    """Values per key, each computed on the first request for its key (on every request when not
    ``enabled``). ``requests`` counts the requests, ``computed`` the values computed."""

    __slots__ = ("_kept", "computed", "enabled", "requests")

    def __init__(self, enabled: bool = True) -> None:
        self._kept: dict[K, V] = {}
        self.enabled = enabled
        self.requests = 0
        self.computed = 0

    def __call__(self, key: K, price: Callable[..., V], *args: Any) -> V:
        """The value kept for ``key``, else ``price(*args)`` (kept for ``key`` when enabled)."""
        self.requests += 1
        if self.enabled:
            kept = self._kept.get(key, _MISSING)
            if kept is not _MISSING:
                return kept  # type: ignore[no-any-return]
        self.computed += 1
        value = price(*args)
        if self.enabled:
            self._kept[key] = value
        return value

    def __len__(self) -> int:
        return len(self._kept)

    @property
    def hits(self) -> int:
        """Requests answered from the memo."""
        return self.requests - self.computed

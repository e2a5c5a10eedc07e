"""The objective a plan is chosen by, written once for the searches, the baselines and the planner.

- ``max-throughput``: the fastest plan that fits; plans whose step times are equal but for
  floating-point rounding (:data:`TIME_TIE`) are a tie, which the least memory decides;
- ``min-memory``: the least memory among plans within ``1 + max_slowdown`` of the fastest plan that
  fits (then the faster); with ``alpha`` (GiB per second) the least ``memory + alpha·time`` over
  every plan that fits instead, with no time limit.

An :class:`Objective` gives the time limit a plan must meet given the fastest plan known
(:meth:`Objective.time_limit`), whether a step time meets it (:meth:`Objective.meets`), a plan's
score (:meth:`Objective.score`, lower is better) and the best of a set of plans
(:meth:`Objective.best`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal, TypeVar

ObjectiveKind = Literal["min-memory", "max-throughput"]

#: Relative difference of two step times that counts as equal (floating-point rounding).
TIME_TIE = 1e-9

#: The slowdown ``min-memory`` allows from the fastest plan unless a request names one.
DEFAULT_MAX_SLOWDOWN = 0.1

T = TypeVar("T")


@dataclass(frozen=True)
class Objective:
    """What a plan request optimises.

    ``kind``: ``min-memory`` or ``max-throughput``. ``max_slowdown``: how much slower than the
    fastest plan a ``min-memory`` answer may be (0.1: 10 %). ``alpha_gib_per_s``: with
    ``min-memory``, trade memory for time at this rate (GiB per second of step time) instead of
    a time limit."""

    kind: ObjectiveKind = "min-memory"
    max_slowdown: float = DEFAULT_MAX_SLOWDOWN
    alpha_gib_per_s: float | None = None

    @classmethod
    def of(cls, kind: str, max_slowdown: float, alpha_gib_per_s: float | None) -> Objective:
        """The objective of a search's arguments (``kind`` other than ``max-throughput``: min-memory)."""
        return cls("max-throughput" if kind == "max-throughput" else "min-memory", max_slowdown, alpha_gib_per_s)

    @property
    def weighted(self) -> bool:
        """Whether memory is traded for time at a rate (``min-memory`` with ``alpha``)."""
        return self.kind == "min-memory" and self.alpha_gib_per_s is not None

    @property
    def alpha_bytes_per_s(self) -> float | None:
        """``alpha`` in bytes per second of step time (None: no rate)."""
        return self.alpha_gib_per_s * 2**30 if self.weighted and self.alpha_gib_per_s is not None else None

    def time_limit(self, fastest_seconds: float) -> float | None:
        """The slowest step time an answer may take when the fastest plan that fits takes
        ``fastest_seconds``: that time (``max-throughput``), ``1 + max_slowdown`` times it
        (``min-memory``), or None (``alpha``: time is traded, not limited). Exact: see :meth:`meets`."""
        if self.kind == "max-throughput":
            return fastest_seconds
        if self.weighted:
            return None
        return self.slowdown_limit(fastest_seconds)

    def slowdown_limit(self, fastest_seconds: float) -> float:
        """``1 + max_slowdown`` times ``fastest_seconds``: ``min-memory``'s limit, and how far a search
        walks from its fastest plan (with ``alpha`` too: a plan slower than that is not looked for)."""
        return fastest_seconds * (1 + self.max_slowdown)

    @staticmethod
    def tolerant(limit_seconds: float) -> float:
        """``limit_seconds`` widened by the tie tolerance: what a step time is compared with."""
        return limit_seconds * (1 + TIME_TIE)

    def meets(self, step_seconds: float, limit_seconds: float | None) -> bool:
        """Whether a plan of ``step_seconds`` meets the limit (within the tie tolerance)."""
        return limit_seconds is None or step_seconds <= self.tolerant(limit_seconds)

    def score(self, peak_bytes: float, step_seconds: float) -> tuple[float, float]:
        """A plan's score among the plans meeting the limit, lower is better: its memory, or its
        ``memory + alpha·time``, then its time."""
        alpha = self.alpha_bytes_per_s
        return (peak_bytes if alpha is None else peak_bytes + alpha * step_seconds), step_seconds

    def best(self, plans: Iterable[T], step_seconds: Callable[[T], float], peak_bytes: Callable[[T], float],
             fastest_seconds: float) -> T | None:
        """The best of ``plans`` (all fitting) given the fastest plan that fits: the least
        :meth:`score` among those meeting :meth:`time_limit` (ties: the first given)."""
        limit = self.time_limit(fastest_seconds)
        return min((p for p in plans if self.meets(step_seconds(p), limit)),
                   key=lambda p: self.score(peak_bytes(p), step_seconds(p)), default=None)

    def cannot_matter(self, least_seconds: float, fastest_seconds: float) -> bool:
        """Whether no plan taking at least ``least_seconds`` can be the answer when a plan known to
        fit takes ``fastest_seconds``: it cannot meet the limit (with ``alpha`` nothing is ruled out
        by time alone)."""
        return not self.meets(least_seconds, self.time_limit(fastest_seconds))

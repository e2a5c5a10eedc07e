"""Pipeline partitions and the counts the DP search tries: contiguous splits of the blocks balanced
by a weight, steps between two splits, pipeline degrees, micro-batch counts, and the frontier of
(step time, memory) points."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from parplan.solver.dp.space import degrees
from parplan.solver.strategy import data_parallel_degrees

P = TypeVar("P")


def balanced_partition(weights: list[float], p: int, scale: Callable[[int, float], float]) -> tuple[int, ...]:
    """Contiguous split into ``p`` non-empty parts minimising the largest part's scaled weight
    (``scale(stage, w)``), by dynamic programming over prefixes."""
    n = len(weights)
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    best = [[math.inf] * (n + 1) for _ in range(p + 1)]
    cut = [[0] * (n + 1) for _ in range(p + 1)]
    best[0][0] = 0.0
    pre = np.array(prefix)
    for k in range(1, p + 1):
        prev = np.array(best[k - 1])
        for j in range(k, n - (p - k) + 1):
            # v_i = max(best[k-1][i], scale(prefix[j] - prefix[i])) for i in k-1..j-1; the first least wins
            v = np.maximum(prev[k - 1:j], scale(k - 1, pre[j] - pre[k - 1:j]))
            i = int(np.argmin(v))
            if v[i] < best[k][j]:
                best[k][j], cut[k][j] = float(v[i]), k - 1 + i
    sizes, j = [], n
    for k in range(p, 0, -1):
        i = cut[k][j]
        sizes.append(j - i)
        j = i
    return tuple(reversed(sizes))


def interpolate(a: tuple[int, ...], b: tuple[int, ...], alpha: float) -> tuple[int, ...]:
    """A partition between ``a`` and ``b``: stage boundaries moved ``alpha`` of the way."""
    ca = np.cumsum(a)
    cb = np.cumsum(b)
    cuts = [round((1 - alpha) * x + alpha * y) for x, y in zip(ca[:-1], cb[:-1], strict=True)]
    sizes, prev = [], 0
    for c in [*cuts, int(ca[-1])]:
        c = max(c, prev + 1)
        sizes.append(c - prev)
        prev = c
    if sum(sizes) != int(ca[-1]) or min(sizes) < 1:
        return a
    return tuple(sizes)


def pipeline_degrees(devices: int, blocks: int) -> list[int]:
    return [p for p in degrees(devices) if p <= blocks]


def microbatch_counts(global_batch: int, pp: int, micro_batch: int | None = None, devices: int = 1) -> list[int]:
    """Micro-batch counts to try: the divisors of the global batch nearest to pp·{1, 2, 4, 8, 16}; with
    a ``micro_batch`` given, ``global_batch / (micro_batch x dp)`` for each data-parallel degree the
    rule allows a stage of ``devices`` (:func:`~parplan.solver.strategy.data_parallel_degrees`)."""
    if micro_batch is not None:
        dps = data_parallel_degrees([d for d in range(1, devices + 1) if devices % d == 0], global_batch, micro_batch)
        return sorted({global_batch // (micro_batch * d) for d in dps})
    divs = [d for d in range(1, global_batch + 1) if global_batch % d == 0]
    out = []
    for k in (1, 2, 4, 8, 16):
        target = pp * k
        out.append(min(divs, key=lambda d: (abs(math.log(d / target)), d)))
    return sorted(set(out))


def undominated(points: list[tuple[float, float, P]]) -> list[tuple[float, float, P]]:
    """Plans no other plan beats on both step time and memory."""
    out: list[tuple[float, float, P]] = []
    for secs, peak, plan in sorted(points, key=lambda x: (x[0], x[1])):
        if not out or peak < out[-1][1]:
            out.append((secs, peak, plan))
    return out

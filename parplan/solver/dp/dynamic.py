"""Dynamic programming over the layers of one pipeline stage (Galvatron-BMW's search).

Layer ``l`` taking strategy ``s`` costs ``time[l, s]`` seconds and ``mem[l, s]`` memory units (bytes
rounded *up* to the granularity, so every answer truly fits); moving from strategy ``s`` to ``s'``
between layers ``l-1`` and ``l`` costs ``switch[l][s, s']``. The DP finds, for every memory budget
``e = 0..E`` at once, the least total time of the layers so far that ends in each strategy and
uses at most ``e`` units:

    f_l[s', e] = time[l, s'] + min_s ( f_{l-1}[s, e - mem[l, s']] + switch[l][s, s'] )

It is exact for its memory granularity (brute force agrees on small instances, see the tests) and
runs in ``O(L · S² · E)`` numpy operations, vectorised over ``e`` and ``s``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

INF = np.inf


@dataclass(frozen=True)
class StageSolution:
    """Least time for a stage under each memory budget, and a way to read back the choices."""

    best_by_budget: npt.NDArray[np.float64]  # [E+1]: least time using at most e units
    _final: npt.NDArray[np.float64]  # [S, E+1]
    _back: list[npt.NDArray[np.int32]]  # per layer >= 1: [S', E+1] argmin previous strategy
    _mem: npt.NDArray[np.int64]

    def choices(self, budget_units: int) -> list[int] | None:
        """Strategy per layer of the best solution within ``budget_units`` (None: infeasible)."""
        e = budget_units
        s = int(np.argmin(self._final[:, e]))
        if not np.isfinite(self._final[s, e]):
            return None
        out = [s]
        for layer in range(len(self._back), 0, -1):
            prev = int(self._back[layer - 1][s, e])
            e -= int(self._mem[layer, s])
            s = prev
            out.append(s)
        out.reverse()
        return out


def solve_stage(time: npt.NDArray[np.float64], mem: npt.NDArray[np.int64], switch: list[npt.NDArray[np.float64]],
                budget_units: int) -> StageSolution:
    """``time`` and ``mem`` are [L, S]; ``switch[l-1]`` is [S, S] between layers l-1 and l."""
    n_layers, n_strat = time.shape
    width = budget_units + 1
    f = np.full((n_strat, width), INF)
    for s in range(n_strat):
        if mem[0, s] <= budget_units:
            f[s, mem[0, s]:] = time[0, s]
    back: list[npt.NDArray[np.int32]] = []
    for layer in range(1, n_layers):
        # h[s', e] = min_s f[s, e] + switch[s, s']   (previous strategy s, entering s')
        totals = f[:, None, :] + switch[layer - 1][:, :, None]
        arg = np.argmin(totals, axis=0).astype(np.int32)
        h = np.take_along_axis(totals, arg[None, :, :], axis=0)[0]
        g = np.full((n_strat, width), INF)
        b = np.zeros((n_strat, width), dtype=np.int32)
        for s in range(n_strat):
            k = int(mem[layer, s])
            if k <= budget_units:
                g[s, k:] = h[s, : width - k] + time[layer, s]
                b[s, k:] = arg[s, : width - k]
        f = g
        back.append(b)
    return StageSolution(f.min(axis=0), f, back, mem)


def brute_force_stage(time: npt.NDArray[np.float64], mem: npt.NDArray[np.int64],
                      switch: list[npt.NDArray[np.float64]], budget_units: int) -> float:
    """Least total time over every assignment within the budget (small instances only)."""
    import itertools

    n_layers, n_strat = time.shape
    best = INF
    for combo in itertools.product(range(n_strat), repeat=n_layers):
        if sum(int(mem[layer, s]) for layer, s in enumerate(combo)) > budget_units:
            continue
        t = sum(float(time[layer, s]) for layer, s in enumerate(combo))
        t += sum(float(switch[layer - 1][combo[layer - 1], combo[layer]]) for layer in range(1, n_layers))
        best = min(best, t)
    return float(best)

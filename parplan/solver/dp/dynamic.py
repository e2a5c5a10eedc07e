"""Dynamic programming over the layers of one pipeline stage (Galvatron-BMW's search).

Layer ``l`` taking strategy ``s`` costs ``time[l, s]`` seconds and ``mem[l, s]`` memory units (bytes
rounded *up* to the granularity, so every answer truly fits); moving from strategy ``s`` to ``s'``
between layers ``l-1`` and ``l`` costs ``switch[l][s, s']``. The DP finds, for every memory budget
``e = 0..E`` at once, the least total time of the layers so far that ends in each strategy and
uses at most ``e`` units:

    f_l[s', e] = time[l, s'] + min_s ( f_{l-1}[s, e - mem[l, s']] + switch[l][s, s'] )

It is exact for its memory granularity (brute force agrees on small instances, see the tests) and
runs in ``O(L · S² · E)`` numpy operations, vectorised over ``e`` and ``s``. When switching costs
only depend on whether two strategies lay the activation out differently —
``switch[l][s, s'] = relayout[l][s']`` if ``key[s] != key[s']`` else 0, which is what the cost model
gives — :func:`solve_stage_keyed` does the same in ``O(L · S · E)``: the best predecessor of ``s'``
is either the best one sharing its key (no cost) or the best of all plus ``relayout[l][s']``.
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
    #: the strategies solved over, when some were left out (their indices in the caller's list)
    _columns: npt.NDArray[np.int64] | None = None

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
        if self._columns is not None:
            return [int(self._columns[s]) for s in out]
        return out


def _first_layer(time: npt.NDArray[np.float64], mem: npt.NDArray[np.int64], budget_units: int) -> npt.NDArray[
        np.float64]:
    """f[s, e] for the first layer: its time when its memory fits in ``e`` units, else inf."""
    e = np.arange(budget_units + 1)
    return np.where(e[None, :] >= mem[0][:, None], time[0][:, None], INF)


def _add_layer(h: npt.NDArray[np.float64], arg: npt.NDArray[np.int32], time_row: npt.NDArray[np.float64],
               mem_row: npt.NDArray[np.int64], budget_units: int) -> tuple[
        npt.NDArray[np.float64], npt.NDArray[np.int32]]:
    """Enter a layer: ``h[s', e]`` is the best cost before it ending so that ``s'`` may follow; the
    layer's memory shifts the budget axis and its time adds on. Returns f and the back-pointers
    (``g[s, e] = h[s, e - mem[s]] + time[s]`` where ``e >= mem[s]``, all strategies at once)."""
    n_strat, width = h.shape
    src = np.arange(width)[None, :] - np.asarray(mem_row, dtype=np.int64)[:, None]  # [S, E+1]
    valid = src >= 0
    src = np.where(valid, src, 0)
    rows = np.arange(n_strat)[:, None]
    g = np.where(valid, h[rows, src] + time_row[:, None], INF)
    b = np.where(valid, arg[rows, src], 0).astype(np.int32)
    return g, b


def solve_stage(time: npt.NDArray[np.float64], mem: npt.NDArray[np.int64], switch: list[npt.NDArray[np.float64]],
                budget_units: int) -> StageSolution:
    """``time`` and ``mem`` are [L, S]; ``switch[l-1]`` is [S, S] between layers l-1 and l."""
    n_layers = time.shape[0]
    f = _first_layer(time, mem, budget_units)
    back: list[npt.NDArray[np.int32]] = []
    for layer in range(1, n_layers):
        # h[s', e] = min_s f[s, e] + switch[s, s']   (previous strategy s, entering s')
        totals = f[:, None, :] + switch[layer - 1][:, :, None]
        arg = np.argmin(totals, axis=0).astype(np.int32)
        h = np.take_along_axis(totals, arg[None, :, :], axis=0)[0]
        f, b = _add_layer(h, arg, time[layer], mem[layer], budget_units)
        back.append(b)
    return StageSolution(f.min(axis=0), f, back, mem)


def solve_stage_keyed(time: npt.NDArray[np.float64], mem: npt.NDArray[np.int64], keys: list[int],
                      relayout: npt.NDArray[np.float64], budget_units: int,
                      leave_out_infeasible: bool = True) -> StageSolution:
    """:func:`solve_stage` for ``switch[l][s, s'] = relayout[l-1, s'] * (keys[s] != keys[s'])``.

    A strategy whose memory exceeds the budget on every layer is never part of a solution: its
    column is infinite on every layer and never the first least entry where that is finite, so it
    is left out (the answer and the choices are the same)."""
    n_layers, n_strat = time.shape
    keep = np.nonzero((mem <= budget_units).any(axis=0))[0]
    if leave_out_infeasible and 0 < len(keep) < n_strat:
        sol = solve_stage_keyed(time[:, keep], mem[:, keep], [keys[int(i)] for i in keep], relayout[:, keep],
                                budget_units)
        return StageSolution(sol.best_by_budget, sol._final, sol._back, sol._mem, keep)
    key_arr = np.asarray(keys)
    _, group_of = np.unique(key_arr, return_inverse=True)  # group of each strategy, by key
    group_of = group_of.reshape(-1)
    order = np.argsort(group_of, kind="stable")  # strategies grouped, in their order within a group
    starts = np.concatenate(([0], np.nonzero(np.diff(group_of[order]))[0] + 1))
    sorted_group = group_of[order]
    position = np.arange(n_strat)[:, None]
    f = _first_layer(time, mem, budget_units)
    back: list[npt.NDArray[np.int32]] = []
    for layer in range(1, n_layers):
        best_all = f.min(axis=0)
        arg_all = f.argmin(axis=0)
        # per key: the least f and the first strategy (in the caller's order) attaining it
        grouped = f[order]
        group_best = np.minimum.reduceat(grouped, starts, axis=0)
        first = np.minimum.reduceat(np.where(grouped == group_best[sorted_group], position, n_strat), starts,
                                    axis=0)
        group_arg = order[first]
        same = group_best[group_of]  # [S, E]: best predecessor sharing the key
        other = best_all[None, :] + relayout[layer - 1][:, None]  # best of all, plus the re-layout
        use_other = other < same
        h = np.where(use_other, other, same)
        arg = np.where(use_other, arg_all[None, :], group_arg[group_of]).astype(np.int32)
        f, b = _add_layer(h, arg, time[layer], mem[layer], budget_units)
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

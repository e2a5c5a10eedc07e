"""Capacity planning: which allocations to try, and what a scheduler wants from their plans.

A *pool* is one GPU type a scheduler can allocate from (``gpus_per_node`` per node, at most
``max_gpus``, at ``price_per_gpu_hour``). A capacity sweep plans the same training job on every
allocation of :func:`gpu_counts` in every pool (one plan request per *cell*), then
:func:`summarise` picks out of the cells' results what a scheduler asks:

- ``fewest_gpus_that_fit``: per pool, the smallest allocation whose plan fits in memory;
- ``cheapest_meeting_deadline``: the fitting cell of least cost whose time to train is within the
  goal's ``deadline_hours`` (ties: faster, then fewer GPUs);
- ``fastest_within_budget``: the fitting cell of least time to train whose cost is within the
  goal's ``budget`` (ties: cheaper, then fewer GPUs);
- ``frontier``: the fitting cells no other fitting cell beats on both time to train and cost
  (the time/cost Pareto frontier), fastest first.

Time to train is ``tokens / tokens_per_second``; cost is that time in hours times the GPUs times
the pool's price per GPU-hour. Scaling efficiency is a cell's throughput per GPU over that of its
pool's smallest fitting cell (1.0 at that cell; below 1 when more GPUs add less than their share).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from parplan.solver.errors import ConfigError


class CapacityError(ConfigError):
    """A capacity request the sweep cannot run (``field`` names the offending input)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class Pool:
    """One GPU type a scheduler can allocate from."""

    gpu: str
    gpus_per_node: int
    max_gpus: int
    price_per_gpu_hour: float


@dataclass(frozen=True)
class Goal:
    """What the scheduler optimises for: a deadline (hours), a budget (currency units), or neither."""

    deadline_hours: float | None = None
    budget: float | None = None


@dataclass(frozen=True)
class CellOutcome:
    """One cell's plan as the sweep saw it. ``status``: ``pending`` (not planned yet), ``done``
    (a plan; ``fits`` says whether it fits in memory), ``unsolvable`` (no plan fits: ``fits``
    false), ``failed`` or ``cancelled`` (no answer)."""

    gpu: str
    gpus: int
    status: str
    plan_id: str | None = None
    fits: bool | None = None
    step_seconds: float | None = None
    tokens_per_second: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class Cell:
    """A cell of the result: the outcome plus what follows from the pool's price and the tokens."""

    outcome: CellOutcome
    scaling_efficiency: float | None
    time_to_train_hours: float | None
    cost: float | None

    @property
    def usable(self) -> bool:
        """A plan that fits, with a throughput (so a time and a cost)."""
        o = self.outcome
        return bool(o.fits) and self.time_to_train_hours is not None and self.cost is not None


@dataclass(frozen=True)
class Summary:
    cells: tuple[Cell, ...]
    fewest_gpus_that_fit: tuple[tuple[str, int | None], ...]  # (pool's gpu, GPUs), pools in order
    cheapest_meeting_deadline: Cell | None
    fastest_within_budget: Cell | None
    frontier: tuple[Cell, ...]
    goal_met: bool | None  # None: no goal, or cells still pending
    complete: bool  # every cell has an answer


def gpu_counts(gpus_per_node: int, max_gpus: int) -> tuple[int, ...]:
    """The allocations tried in a pool: the powers of two below one node (1, 2, 4 for 8-GPU
    nodes; a job may share a node) and every whole number of nodes up to ``max_gpus`` (which
    contains every power of two from one node up). Ascending."""
    if gpus_per_node < 1:
        raise CapacityError("gpus_per_node", "must be at least 1")
    if max_gpus < 1:
        raise CapacityError("max_gpus", "must be at least 1")
    below = [1 << k for k in range(gpus_per_node.bit_length()) if (1 << k) < gpus_per_node and (1 << k) <= max_gpus]
    nodes = [gpus_per_node * n for n in range(1, max_gpus // gpus_per_node + 1)]
    return tuple(sorted(set(below) | set(nodes)))


def _cell(o: CellOutcome, pool: Pool, base_per_gpu: float | None, tokens: float) -> Cell:
    tps = o.tokens_per_second
    if not o.fits or tps is None or tps <= 0:
        return Cell(o, None, None, None)
    hours = tokens / tps / 3600.0
    eff = (tps / o.gpus) / base_per_gpu if base_per_gpu else None
    return Cell(o, eff, hours, hours * o.gpus * pool.price_per_gpu_hour)


def price_cells(pools: Sequence[Pool], outcomes: Iterable[CellOutcome], tokens: float) -> tuple[Cell, ...]:
    """Each outcome with its pool's time, cost and scaling efficiency (outcomes name their pool by
    ``gpu``; a GPU type appears in one pool)."""
    by_gpu = {p.gpu: p for p in pools}
    outs = list(outcomes)
    base: dict[str, float] = {}
    for o in sorted(outs, key=lambda o: o.gpus):
        if o.fits and o.tokens_per_second and o.gpu not in base:
            base[o.gpu] = o.tokens_per_second / o.gpus
    return tuple(_cell(o, by_gpu[o.gpu], base.get(o.gpu), tokens) for o in outs)


def fewest_that_fit(cells: Iterable[Cell], gpu: str) -> int | None:
    """The smallest allocation of pool ``gpu`` whose plan fits, or None."""
    fitting = [c.outcome.gpus for c in cells if c.outcome.gpu == gpu and c.outcome.fits]
    return min(fitting) if fitting else None


def cheapest_meeting_deadline(cells: Iterable[Cell], deadline_hours: float) -> Cell | None:
    ok = [c for c in cells if c.usable and c.time_to_train_hours is not None
          and c.time_to_train_hours <= deadline_hours]
    return min(ok, key=lambda c: (c.cost, c.time_to_train_hours, c.outcome.gpus), default=None)


def fastest_within_budget(cells: Iterable[Cell], budget: float) -> Cell | None:
    ok = [c for c in cells if c.usable and c.cost is not None and c.cost <= budget]
    return min(ok, key=lambda c: (c.time_to_train_hours, c.cost, c.outcome.gpus), default=None)


def frontier(cells: Iterable[Cell]) -> tuple[Cell, ...]:
    """The usable cells no other usable cell matches or beats on both time and cost with one
    strictly better; fastest first (of equal points, the one with fewer GPUs is kept)."""
    pts = sorted((c for c in cells if c.usable),
                 key=lambda c: (c.time_to_train_hours, c.cost, c.outcome.gpus))
    out: list[Cell] = []
    best_cost = float("inf")
    for c in pts:
        assert c.cost is not None
        if c.cost < best_cost:
            out.append(c)
            best_cost = c.cost
    return tuple(out)


def summarise(pools: Sequence[Pool], outcomes: Iterable[CellOutcome], tokens: float, goal: Goal) -> Summary:
    """Everything the capacity result reports, from the cells answered so far."""
    cells = price_cells(pools, outcomes, tokens)
    complete = all(c.outcome.status != "pending" for c in cells)
    cheapest = cheapest_meeting_deadline(cells, goal.deadline_hours) if goal.deadline_hours is not None else None
    fastest = fastest_within_budget(cells, goal.budget) if goal.budget is not None else None
    wanted = [x for x, asked in ((cheapest, goal.deadline_hours), (fastest, goal.budget)) if asked is not None]
    goal_met = None if not wanted or not complete else all(x is not None for x in wanted)
    return Summary(cells=cells,
                   fewest_gpus_that_fit=tuple((p.gpu, fewest_that_fit(cells, p.gpu)) for p in pools),
                   cheapest_meeting_deadline=cheapest, fastest_within_budget=fastest,
                   frontier=frontier(cells), goal_met=goal_met, complete=complete)

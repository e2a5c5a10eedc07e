"""The auxiliary-graph ILP (memory-redundancy paper, objective (5), constraints (6)-(8)).

The auxiliary graph has one vertex per (operator, candidate strategy) and one edge per
(producer strategy, consumer strategy) pair of every original edge. Binary ``X[v][s]`` picks a
strategy; ``B[e][s, t]`` picks an auxiliary edge. Repeated layers share variables: a vertex or edge
stands for ``count`` identical copies and its costs are multiplied by that count.

Objectives (memory ``M`` in bytes per device, time ``C`` in seconds per step):

- ``weighted``: minimise ``M + alpha·C`` (the paper's (5); ``alpha`` in bytes per second);
- ``time``: minimise ``C`` subject to ``M <= budget`` (Alpa's formulation);
- ``memory``: minimise ``M`` subject to ``C <= time_limit`` (and ``M <= budget``).

``B`` may be continuous: with ``X`` binary, constraints (7)-(8) leave exactly one edge of each
original edge at 1. :mod:`.backends` solves it (HiGHS, or CBC as the fallback). Peak terms implied by another
(:func:`kept_peaks`) and edges that cost nothing under any choice are left out of the model: the
optimum is the same. A node's or edge's buffers that several peak terms hold in the same proportion
(a block's saved activations, counted at every later moment) are written once, as a continuous
variable equal to their sum, which the terms then name: the same model with a third to a half of
the nonzeros (t5-11b: 287,000 to 132,000). Inside the model
memory is in GiB (costs in bytes next to seconds span fifteen orders of magnitude, which HiGHS
does not tolerate); results are reported in bytes.
"""

# ruff: noqa: N803, N806  (X and B are the paper's variable names)

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from parplan.solver.errors import SolverError
from parplan.solver.ilp.backends import HIGHS_OPTIONS as HIGHS_OPTIONS  # re-exported: the solver's settings
from parplan.solver.ilp.backends import MIP_REL_GAP as MIP_REL_GAP
from parplan.solver.ilp.backends import Formulation, run
from parplan.solver.ilp.backends import configured_highs as configured_highs

if TYPE_CHECKING:
    import numpy as np

Objective = Literal["weighted", "time", "memory"]

#: Memory unit inside the model (bytes per unit).
_MEM = float(2**30)

#: A MIP solver accepts a choice that breaks a row by up to its feasibility tolerance, in the row's
#: own units (HiGHS's ``mip_feasibility_tolerance`` is 1e-6, CBC's primal tolerance 1e-7). A step
#: time limit written in seconds could then be exceeded by a microsecond, 0.1 % of a 1 ms step, and
#: the planner, which checks the limit exactly, would refuse the answer for a slower plan
#: (tests/solver/test_never_dominated.py). Under a time limit, time is written in units of the
#: limit, and the row stops this far below 1.
ROW_TOLERANCE = 1e-6

@dataclass
class AuxNode:
    """An operator (or ``count`` identical ones) and the costs of each candidate strategy."""

    key: str
    memory: list[float]
    seconds: list[float]
    count: int = 1


@dataclass
class AuxEdge:
    """An original edge (or ``count`` identical ones).

    ``seconds[i][j]`` / ``memory[i][j]`` are the costs when the producer's strategy is in class
    ``i`` and the consumer's in class ``j``; ``src_class[s]`` / ``dst_class[t]`` give each
    strategy's class (None: every strategy is its own class). Strategies in one class give the
    tensor the same layout, so the edge's cost depends only on the classes: one auxiliary edge per
    pair of classes stands for all the strategy pairs in it, an exact compression.
    """

    src: str
    dst: str
    seconds: list[list[float]]
    memory: list[list[float]] | None = None
    count: int = 1
    src_class: list[int] | None = None
    dst_class: list[int] | None = None

    def cls(self, side: str, strategy: int) -> int:
        classes = self.src_class if side == "src" else self.dst_class
        return strategy if classes is None else classes[strategy]

    def seconds_of(self, choice: dict[str, int]) -> float:
        """Seconds of the ``count`` copies of this edge under a choice."""
        return self.count * self.seconds[self.cls("src", choice[self.src])][self.cls("dst", choice[self.dst])]


@dataclass
class Gate:
    """Bytes of one node per strategy, held only while some strategy of ``when`` is chosen: the
    product of one node's term and an OR over strategies of other nodes (a tied table's gradient,
    which gradient accumulation keeps where any unit reading the table gathers its weights). In the
    model (:func:`_gate_columns`): a binary ``Y`` for the OR, and per strategy ``s`` of ``node``
    ``W_s = X[node][s]·Y``, each product by the standard linearisation."""

    node: str
    values: Sequence[float] | np.ndarray  # bytes per strategy of ``node``
    when: dict[str, tuple[int, ...]]  # per node, the strategies that open the gate

    def is_open(self, choice: dict[str, int]) -> bool:
        return any(choice[k] in strategies for k, strategies in self.when.items())

    def value(self, choice: dict[str, int]) -> float:
        return float(self.values[choice[self.node]]) if self.is_open(choice) else 0.0


@dataclass
class PeakTerm:
    """Buffers that live at the same moment (one block's ZeRO-3 gathers and recomputed activations,
    one resharding buffer, the logits' gradient): bytes per strategy of some nodes and per class
    pair of some edges, and some of the problem's gates (each with a coefficient). The temporary
    peak is the largest term, modelled as ``T >= term``."""

    #: per node, bytes per strategy; per edge, bytes per pair of classes (lists, or numpy arrays
    #: as :mod:`.moments` makes them)
    nodes: dict[str, Sequence[float] | np.ndarray] = field(default_factory=dict)
    edges: dict[int, Sequence[Sequence[float]] | np.ndarray] = field(default_factory=dict)
    #: per gate (an index into ``AuxProblem.gates``), its coefficient
    gates: dict[int, float] = field(default_factory=dict)

    def value(self, problem: AuxProblem, choice: dict[str, int]) -> float:
        v = sum(float(vals[choice[k]]) for k, vals in self.nodes.items())
        for ei, vals in self.edges.items():
            e = problem.edges[ei]
            v += float(vals[e.cls("src", choice[e.src])][e.cls("dst", choice[e.dst])])
        return v + sum(k * problem.gates[g].value(choice) for g, k in self.gates.items())


@dataclass
class AuxProblem:
    nodes: dict[str, AuxNode] = field(default_factory=dict)
    edges: list[AuxEdge] = field(default_factory=list)
    peaks: list[PeakTerm] = field(default_factory=list)
    #: groups of edges reading one tensor (their counts equal): the group costs the most expensive of
    #: its edges' seconds, not their sum (one conversion and one gradient reduction serve every reader
    #: that needs the tensor alike, as Megatron-LM's fused QKV projection gathers its input once)
    shared: list[list[int]] = field(default_factory=list)
    #: (the peak terms, their number, the indices of those not implied by others), see :func:`kept_peaks`
    kept_peak_terms: tuple[list[PeakTerm], int, list[int]] | None = field(default=None, repr=False, compare=False)
    #: bytes every choice holds besides its terms (workspaces, buckets: Runtime.held_through_step_bytes)
    fixed_bytes: float = 0.0
    #: bytes every choice is known to hold at least, from outside the terms (0: none known; see
    #: :func:`~parplan.solver.ilp.problem.least_bytes`); part of :meth:`memory_lower_bound`
    floor_bytes: float = 0.0
    #: products of a node's term and an OR over strategies, which peak terms name by index
    gates: list[Gate] = field(default_factory=list)

    def gate(self, gate: Gate) -> int:
        """The index of ``gate`` in :attr:`gates` (added unless an equal one is there)."""
        import numpy as np

        values = np.asarray(gate.values, dtype=np.float64)
        for g, other in enumerate(self.gates):
            if other.node == gate.node and other.when == gate.when and np.array_equal(other.values, values):
                return g
        self.gates.append(Gate(gate.node, values, dict(gate.when)))
        return len(self.gates) - 1

    def edge_seconds(self, choice: dict[str, int]) -> float:
        """Seconds of every edge under a choice, shared groups at their costliest member."""
        grouped = {ei for g in self.shared for ei in g}
        sec = sum(e.seconds_of(choice) for ei, e in enumerate(self.edges) if ei not in grouped)
        return sec + sum(max(self.edges[ei].seconds_of(choice) for ei in g) for g in self.shared)

    def peak(self, choice: dict[str, int]) -> float:
        """The temporary peak of a choice: its largest peak term (0 without any)."""
        return max((t.value(self, choice) for t in self.peaks), default=0.0)

    def totals(self, choice: dict[str, int]) -> tuple[float, float]:
        """(memory, seconds) of a full choice of strategies, recomputed from the cost tables;
        memory includes the temporary peak."""
        mem = self.fixed_bytes + self.peak(choice) + sum(n.count * n.memory[choice[k]] for k, n in self.nodes.items())
        sec = sum(n.count * n.seconds[choice[k]] for k, n in self.nodes.items()) + self.edge_seconds(choice)
        for e in self.edges:
            if e.memory is not None:
                mem += e.count * e.memory[e.cls("src", choice[e.src])][e.cls("dst", choice[e.dst])]
        return mem, sec

    def memory_lower_bound(self) -> float:
        """Bytes every choice needs at least. The temporary peak is at least each of its terms, so
        for any one term the choice holds at least, per node, its least model states plus that term
        at the same strategy, and per edge the term's least value; the bound is the largest such sum
        over the terms that can be the largest (:func:`kept_peaks`), or the nodes' least memory
        without any, and at least ``floor_bytes``. Above the budget (or a known answer's memory), no
        choice there is better and no solve is needed."""
        edge_least = sum(e.count * min(min(row) for row in e.memory) for e in self.edges if e.memory is not None)
        states = {k: [n.count * m for m in n.memory] for k, n in self.nodes.items()}
        base = self.fixed_bytes + edge_least
        bound = max(base + sum(min(v) for v in states.values()), self.floor_bytes)
        for pi in kept_peaks(self) if self.peaks else ():
            term = self.peaks[pi]
            value = base + sum(min(v) for k, v in states.items() if k not in term.nodes)
            value += sum(min(a + b for a, b in zip(states[k], vals, strict=True)) for k, vals in term.nodes.items())
            value += sum(min(min(row) for row in m) for m in term.edges.values())
            value += sum(min(0.0, min(k * float(v) for v in self.gates[g].values)) for g, k in term.gates.items())
            bound = max(bound, value)
        return bound

    def seconds_lower_bound(self) -> float:
        """Seconds every choice needs at least: each node's least time (edges add nothing negative)."""
        return sum(n.count * min(n.seconds) for n in self.nodes.values())

    @property
    def size(self) -> tuple[int, int]:
        """(vertices, edges) of the auxiliary graph."""
        return (sum(len(n.memory) for n in self.nodes.values()),
                sum(len(e.seconds) * len(e.seconds[0]) for e in self.edges))


@dataclass(frozen=True)
class IlpResult:
    """A solved ILP: the chosen strategy index per node, its totals, and how the solve went."""

    status: Literal["optimal", "feasible", "infeasible"]
    choice: dict[str, int]
    memory: float
    seconds: float
    objective: float
    gap: float | None
    solve_seconds: float
    backend: str
    variables: int = 0  # the model's size (after leaving out implied peak terms and costless edges)
    constraints: int = 0
    nonzeros: int = 0

    @property
    def least_possible(self) -> float:
        """The objective no choice of this problem beats, as the solve proved it (its gap)."""
        return -math.inf if self.gap is None else self.objective * (1 - self.gap)


class InfeasibleError(SolverError):
    """No choice satisfies the constraints."""


def kept_peaks(problem: AuxProblem) -> list[int]:
    """Indices of the peak terms that can be the largest (the others are implied).

    Term ``a`` is implied by a kept term ``b`` when ``a·x <= b·x`` for every choice ``x``: a choice
    takes one strategy per node and one class pair per edge, and a gate is closed or at one of its
    node's values, so it suffices that the sum over nodes, edges and gates of the largest ``a - b``
    among the node's strategies (the edge's class pairs, the gate's values and 0) is at most 0.
    Then ``T >= b·x`` already gives ``T >= a·x``: dropping ``a`` changes no optimum.
    Terms are examined from the largest possible value down, each against the terms kept so far
    (a term is only dropped for one that is kept; of equal terms the first is kept), so every
    dropped term is implied by a kept one. Cached on the problem (its terms do not
    change once built; a new list of terms is examined again)."""
    cached = problem.kept_peak_terms
    if cached is not None and cached[0] is problem.peaks and cached[1] == len(problem.peaks):
        return cached[2]
    import numpy as np

    n = len(problem.peaks)
    # one column per (node, strategy) and (edge, class pair) some term names, grouped by node (edge)
    groups: dict[tuple[str, object], tuple[int, int]] = {}  # (kind, key) -> (first column, columns)
    starts: list[int] = []
    width = 0
    for t in problem.peaks:
        sized: list[tuple[tuple[str, object], int]] = [(("n", k), len(vals)) for k, vals in t.nodes.items()]
        sized += [(("e", ei), len(m) * len(m[0])) for ei, m in t.edges.items()]
        # a gate: its node's value per strategy while open, then 0 (closed)
        sized += [(("g", gi), len(problem.gates[gi].values) + 1) for gi in t.gates]
        for g, size in sized:
            if g not in groups:
                groups[g] = (width, size)
                starts.append(width)
                width += size
    A = np.zeros((n, width))
    for r, t in enumerate(problem.peaks):
        for k, vals in t.nodes.items():
            first, size = groups[("n", k)]
            A[r, first:first + size] = vals
        for ei, m in t.edges.items():
            first, size = groups[("e", ei)]
            A[r, first:first + size] = np.asarray(m, dtype=np.float64).ravel()
        for gi, coef in t.gates.items():
            first, size = groups[("g", gi)]
            A[r, first:first + size - 1] = coef * np.asarray(problem.gates[gi].values, dtype=np.float64)
    idx = np.array(starts, dtype=np.intp)
    if width == 0:
        kept = list(range(n))
    else:
        # largest possible value of each term first: a term can only be implied by one whose largest
        # value is at least its own, so each is compared with the terms kept so far (few) only
        top = np.maximum.reduceat(A, idx, axis=1).sum(axis=1)
        kept = []
        K = np.empty_like(A)  # the kept terms' rows, in the order kept
        for a in sorted(range(n), key=lambda r: (-top[r], r)):
            if kept:
                worst = np.maximum.reduceat(A[a] - K[:len(kept)], idx, axis=1).sum(axis=1)
                if (worst <= 0).any():
                    continue
            K[len(kept)] = A[a]
            kept.append(a)
        kept.sort()
    problem.kept_peak_terms = (problem.peaks, n, kept)
    return kept


def _shape(kind: str, key: object, vals: Any) -> tuple[np.ndarray, float, tuple[str, object, bytes]] | None:
    """A peak term's values of one node (``kind`` "n") or edge ("e") as a flat array, its largest
    magnitude, and the key of its shape (the values over that magnitude); None when all are 0."""
    import numpy as np

    arr = np.asarray(vals, dtype=np.float64).ravel()
    scale = float(np.abs(arr).max())
    return (arr, scale, (kind, key, (arr / scale).round(12).tobytes())) if scale else None


def _shared_shapes(problem: AuxProblem, kept: list[int]) -> set[tuple[str, object, bytes]]:
    """The (node or edge, normalised values) pairs that more than one kept peak term holds."""
    seen: dict[tuple[str, object, bytes], int] = {}
    for pi in kept:
        term = problem.peaks[pi]
        items = [("n", k, v) for k, v in term.nodes.items()] + [("e", ei, v) for ei, v in term.edges.items()]
        for kind, key, vals in items:
            shaped = _shape(kind, key, vals)
            if shaped is not None:
                seen[shaped[2]] = seen.get(shaped[2], 0) + 1
    return {shape for shape, n in seen.items() if n > 1}


def formulate(problem: AuxProblem, objective: Objective, *, alpha: float = 0.0, budget: float | None = None,
              time_limit: float | None = None, start: dict[str, int] | None = None,
              cutoff: float | None = None) -> tuple[Formulation, dict[str, list[int]]]:
    """The model of ``problem`` for ``objective``: (formulation, columns of each node's ``X``)."""
    f = Formulation()
    # seconds per unit of the model's time: the limit's, so that the row's tolerance is relative
    unit = time_limit if time_limit else 1.0
    X: dict[str, list[int]] = {}
    mem_terms: list[tuple[int, float]] = []
    sec_terms: list[tuple[int, float]] = []
    values: list[float] = []
    for k, node in problem.nodes.items():
        X[k] = [f.col(f"X_{_safe(k)}_{s}", binary=True) for s in range(len(node.memory))]
        if start is not None:
            values += [1.0 if start[k] == s else 0.0 for s in range(len(node.memory))]
        # (6) each operator takes exactly one strategy
        f.row(f"one_strategy__{_safe(k)}", [(x, 1.0) for x in X[k]], 1.0, 1.0)
        for s, x in enumerate(X[k]):
            mem_terms.append((x, node.count * node.memory[s] / _MEM))
            sec_terms.append((x, node.count * node.seconds[s] / unit))
    grouped = {ei for g in problem.shared for ei in g}
    in_peaks = {ei for t in problem.peaks for ei in t.edges}
    edge_vars: dict[int, list[list[int]]] = {}
    for ei, e in enumerate(problem.edges):
        if ei not in in_peaks and e.memory is None and not any(any(row) for row in e.seconds):
            continue  # costs nothing under any choice: its auxiliary edges decide nothing
        ns, nt = len(e.seconds), len(e.seconds[0])
        B = [[f.col(f"B_{ei}_{s}_{t}") for t in range(nt)] for s in range(ns)]
        edge_vars[ei] = B
        if start is not None:
            cs, ct = e.cls("src", start[e.src]), e.cls("dst", start[e.dst])
            values += [1.0 if (s, t) == (cs, ct) else 0.0 for s in range(ns) for t in range(nt)]
        for t in range(nt):
            # (7) the consumer's chosen strategy (class) receives exactly one auxiliary edge of this edge
            f.row(f"edge_in__{ei}_{t}", [(B[s][t], 1.0) for s in range(ns)]
                  + [(x, -1.0) for k, x in enumerate(X[e.dst]) if e.cls("dst", k) == t], 0.0, 0.0)
        for s in range(ns):
            # (8) the producer's chosen strategy (class) sends exactly one auxiliary edge of this edge
            f.row(f"edge_out__{ei}_{s}", [(B[s][t], 1.0) for t in range(nt)]
                  + [(x, -1.0) for k, x in enumerate(X[e.src]) if e.cls("src", k) == s], 0.0, 0.0)
        for s in range(ns):
            for t in range(nt):
                if e.seconds[s][t] and ei not in grouped:
                    sec_terms.append((B[s][t], e.count * e.seconds[s][t] / unit))
                if e.memory is not None and e.memory[s][t]:
                    mem_terms.append((B[s][t], e.count * e.memory[s][t] / _MEM))
    for gi, group in enumerate(problem.shared):
        Z = f.col(f"Z_shared_{gi}", 0.0, math.inf)
        if start is not None:
            values.append(max(problem.edges[ei].seconds_of(start) for ei in group) / unit)
        sec_terms.append((Z, 1.0))
        for ei in group:
            e = problem.edges[ei]
            expr = [(edge_vars[ei][s][t], e.count * e.seconds[s][t] / unit) for s in range(len(e.seconds))
                    for t in range(len(e.seconds[0])) if e.seconds[s][t]] if ei in edge_vars else []
            if expr:
                # readers of one tensor share its conversion: the group costs its costliest edge
                f.row(f"shared__{gi}_{ei}", [*expr, (Z, -1.0)], -math.inf, 0.0)
    if problem.peaks:
        T = f.col("T_temporary_peak", 0.0, math.inf)
        if start is not None:
            values.append(problem.peak(start) / _MEM)
        mem_terms.append((T, 1.0))
        kept = kept_peaks(problem)
        shared = _shared_shapes(problem, kept)
        sums: dict[tuple[str, object, bytes], int] = {}

        def part(kind: str, key: object, vals: Any, cols: list[int], at_start: int | None) -> list[tuple[int, float]]:
            """The term's ``vals`` over ``cols``: written out, or through the sum of its shape."""
            shaped = _shape(kind, key, vals)
            if shaped is None:
                return []
            arr, scale, shape = shaped
            if shape not in shared:
                return [(c, v / _MEM) for c, v in zip(cols, arr.tolist(), strict=True) if v]
            y = sums.get(shape)
            if y is None:
                y = sums[shape] = f.col(f"S_{kind}{len(sums)}", 0.0, math.inf)
                if at_start is not None:
                    values.append(float(arr[at_start]) / scale)
                # the shape's sum, written once: terms that hold these buffers in proportion refer to it
                f.row(f"shape__{kind}{len(sums) - 1}",
                      [(c, v / scale) for c, v in zip(cols, arr.tolist(), strict=True) if v] + [(y, -1.0)], 0.0, 0.0)
            return [(y, scale / _MEM)]

        W = _gate_columns(f, problem, X, {gi for pi in kept for gi in problem.peaks[pi].gates}, start, values)
        for pi in kept:
            term = problem.peaks[pi]
            held: list[tuple[int, float]] = [(w, k * v / _MEM) for gi, k in term.gates.items() for w, v in W[gi]]
            for k, vals in term.nodes.items():
                held += part("n", k, vals, X[k], None if start is None else start[k])
            for ei, pairs in term.edges.items():
                e = problem.edges[ei]
                nt = len(e.seconds[0])
                cols = [c for row in edge_vars[ei] for c in row]
                at = None if start is None else e.cls("src", start[e.src]) * nt + e.cls("dst", start[e.dst])
                held += part("e", ei, pairs, cols, at)
            if held:
                # the temporary peak is at least every set of buffers that coexist (implied ones left out)
                f.row(f"peak__{pi}", [*held, (T, -1.0)], -math.inf, 0.0)
    if objective == "weighted":
        # (5) memory + alpha * time (alpha given in bytes per second)
        obj = mem_terms + [(j, (alpha / _MEM) * unit * v) for j, v in sec_terms]
    elif objective == "time":
        obj = sec_terms
    else:
        obj = mem_terms
    for j, v in obj:
        f.cost[j] += v
    if budget is not None:
        # memory per device within the budget
        f.row("memory_budget", mem_terms, -math.inf, (budget - problem.fixed_bytes) / _MEM)
    if time_limit is not None:
        # step time within the limit (in its units), below it by twice the tolerance a solver allows
        f.row("time_limit", sec_terms, -math.inf, 1.0 - 2 * ROW_TOLERANCE)
    if cutoff is not None:
        # only a choice better than one already known is of interest
        # (the objective's memory leaves out the fixed bytes)
        better = cutoff * (1 - MIP_REL_GAP)  # better by more than the gap at which a solve stops
        bound = better / unit if objective == "time" else (better - problem.fixed_bytes) / _MEM
        f.row("better_than_known", obj, -math.inf, bound)
    if start is not None:
        f.start = values
    return f, X


def _gate_columns(f: Formulation, problem: AuxProblem, X: dict[str, list[int]], used: set[int],
                  start: dict[str, int] | None, values: list[float]) -> dict[int, list[tuple[int, float]]]:
    """The columns of the gates ``used`` (see :class:`Gate`): per gate, ``(W_s, bytes)`` for each
    strategy ``s`` of its node with bytes, ``W_s = X[node][s]·Y`` where ``Y`` (one per OR, shared by
    the gates that have it) is the OR of the ``X`` of the strategies that open the gate."""
    ors: dict[tuple[tuple[str, tuple[int, ...]], ...], int] = {}
    out: dict[int, list[tuple[int, float]]] = {}
    for gi in sorted(used):
        gate = problem.gates[gi]
        opens = [X[k][j] for k, strategies in sorted(gate.when.items()) for j in strategies]
        out[gi] = []
        if not opens:
            continue  # never open
        key = tuple(sorted(gate.when.items()))
        Y = ors.get(key)
        if Y is None:
            Y = ors[key] = f.col(f"Y_any_{len(ors)}", binary=True)
            if start is not None:
                values.append(1.0 if gate.is_open(start) else 0.0)
            for x in opens:
                # Y >= X[k][j]: the OR is 1 when any strategy that opens it is chosen
                f.row(f"or_any__{Y}_{x}", [(x, 1.0), (Y, -1.0)], -math.inf, 0.0)
            # Y <= sum of those X[k][j]: the OR is 0 when none of them is chosen
            f.row(f"or_none__{Y}", [(Y, 1.0)] + [(x, -1.0) for x in opens], -math.inf, 0.0)
        for s, v in enumerate(gate.values):
            if not v:
                continue
            w, x = f.col(f"W_gate_{gi}_{s}"), X[gate.node][s]
            if start is not None:
                values.append(1.0 if start[gate.node] == s and gate.is_open(start) else 0.0)
            # W_s = X[node][s]·Y, the standard linearisation of a product of binaries:
            # W_s <= X[node][s]
            f.row(f"and_x__{gi}_{s}", [(w, 1.0), (x, -1.0)], -math.inf, 0.0)
            # W_s <= Y
            f.row(f"and_y__{gi}_{s}", [(w, 1.0), (Y, -1.0)], -math.inf, 0.0)
            # W_s >= X[node][s] + Y - 1
            f.row(f"and_both__{gi}_{s}", [(w, 1.0), (x, -1.0), (Y, -1.0)], -1.0, math.inf)
            out[gi].append((w, float(v)))
    return out


def solve_aux(problem: AuxProblem, objective: Objective, *, alpha: float = 0.0, budget: float | None = None,
              time_limit: float | None = None, timeout_seconds: float = 60.0, backend: str = "highs",
              start: dict[str, int] | None = None, cutoff: float | None = None,
              work: dict[str, int] | None = None, gap: float = MIP_REL_GAP) -> IlpResult:
    """Build the model, solve it to the relative ``gap``, and extract the choice (raises
    InfeasibleError).

    ``start`` is a known feasible choice handed to the solver as its first incumbent. ``cutoff``
    (the objective's unit) asks only for a choice better than it by more than MIP_REL_GAP: none is
    InfeasibleError, which often proved sooner than an optimum is found. ``work`` (when given)
    counts the solve and adds the model's variables, constraints and nonzeros, whatever the
    outcome."""
    t0 = time.perf_counter()
    f, X = formulate(problem, objective, alpha=alpha, budget=budget, time_limit=time_limit, start=start,
                     cutoff=cutoff)
    if work is not None:
        for key, n in zip(("solves", "variables", "constraints", "nonzeros"), (1, *f.size), strict=True):
            work[key] = work.get(key, 0) + n
    status, reached, used, values = run(f, timeout_seconds, backend, warm=start is not None and cutoff is None,
                                        gap=gap)
    if status == "infeasible":
        raise InfeasibleError("no strategy assignment satisfies the constraints")
    choice = {k: max(range(len(v)), key=lambda s, v=v: values[v[s]]) for k, v in X.items()}  # type: ignore[misc]
    mem, sec = problem.totals(choice)
    obj = mem + alpha * sec if objective == "weighted" else (sec if objective == "time" else mem)
    return IlpResult(status, choice, mem, sec, obj, reached, time.perf_counter() - t0, used, *f.size)


def _safe(key: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in key)


def brute_force(problem: AuxProblem, objective: Objective, *, alpha: float = 0.0, budget: float | None = None,
                time_limit: float | None = None) -> tuple[float, dict[str, int]] | None:
    """Enumerate every choice (small problems only): the best objective and a choice reaching it."""
    import itertools

    keys: Sequence[str] = list(problem.nodes)
    best: tuple[float, dict[str, int]] | None = None
    for combo in itertools.product(*(range(len(problem.nodes[k].memory)) for k in keys)):
        choice = dict(zip(keys, combo, strict=True))
        mem, sec = problem.totals(choice)
        if budget is not None and mem > budget:
            continue
        if time_limit is not None and sec > time_limit:
            continue
        obj = mem + alpha * sec if objective == "weighted" else (sec if objective == "time" else mem)
        if best is None or obj < best[0]:
            best = (obj, choice)
    return best

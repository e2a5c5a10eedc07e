"""The auxiliary-graph ILP (memory-redundancy paper, objective (5), constraints (6)-(8)), with PuLP.

The auxiliary graph has one vertex per (operator, candidate strategy) and one edge per
(producer strategy, consumer strategy) pair of every original edge. Binary ``X[v][s]`` picks a
strategy; ``B[e][s, t]`` picks an auxiliary edge. Repeated layers share variables: a vertex or edge
stands for ``count`` identical copies and its costs are multiplied by that count.

Objectives (memory ``M`` in bytes per device, time ``C`` in seconds per step):

- ``weighted``: minimise ``M + alpha·C`` (the paper's (5); ``alpha`` in bytes per second);
- ``time``: minimise ``C`` subject to ``M <= budget`` (Alpa's formulation);
- ``memory``: minimise ``M`` subject to ``C <= time_limit`` (and ``M <= budget``).

``B`` may be continuous: with ``X`` binary, constraints (7)-(8) leave exactly one edge of each
original edge at 1. HiGHS (through highspy) solves it; CBC is the fallback. Inside the model
memory is in GiB (costs in bytes next to seconds span fifteen orders of magnitude, which HiGHS
does not tolerate); results are reported in bytes.
"""

# ruff: noqa: N806  (X and B are the paper's variable names)

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pulp

from parplan.solver.errors import SolverError

Objective = Literal["weighted", "time", "memory"]

#: Memory unit inside the model (bytes per unit).
_MEM = float(2**30)


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
class PeakTerm:
    """Buffers that live at the same moment (one block's ZeRO-3 gathers and recomputed activations,
    one resharding buffer, the logits' gradient): bytes per strategy of some nodes and per class
    pair of some edges. The temporary peak is the largest term, modelled as ``T >= term``."""

    nodes: dict[str, list[float]] = field(default_factory=dict)
    edges: dict[int, list[list[float]]] = field(default_factory=dict)

    def value(self, problem: AuxProblem, choice: dict[str, int]) -> float:
        v = sum(vals[choice[k]] for k, vals in self.nodes.items())
        for ei, vals in self.edges.items():
            e = problem.edges[ei]
            v += vals[e.cls("src", choice[e.src])][e.cls("dst", choice[e.dst])]
        return v


@dataclass
class AuxProblem:
    nodes: dict[str, AuxNode] = field(default_factory=dict)
    edges: list[AuxEdge] = field(default_factory=list)
    peaks: list[PeakTerm] = field(default_factory=list)
    #: groups of edges reading one tensor (their counts equal): the group costs the most expensive of
    #: its edges' seconds, not their sum (one conversion and one gradient reduction serve every reader
    #: that needs the tensor alike, as Megatron-LM's fused QKV projection gathers its input once)
    shared: list[list[int]] = field(default_factory=list)

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
        mem = self.peak(choice) + sum(n.count * n.memory[choice[k]] for k, n in self.nodes.items())
        sec = sum(n.count * n.seconds[choice[k]] for k, n in self.nodes.items()) + self.edge_seconds(choice)
        for e in self.edges:
            if e.memory is not None:
                mem += e.count * e.memory[e.cls("src", choice[e.src])][e.cls("dst", choice[e.dst])]
        return mem, sec

    def memory_lower_bound(self) -> float:
        """Bytes every choice needs at least: each node's least memory (edges and the temporary
        peak add nothing negative). Above the budget, no choice fits and no solve is needed."""
        bound = sum(n.count * min(n.memory) for n in self.nodes.values())
        for e in self.edges:
            if e.memory is not None:
                bound += e.count * min(min(row) for row in e.memory)
        return bound

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


class InfeasibleError(SolverError):
    """No choice satisfies the constraints."""


def solve_aux(problem: AuxProblem, objective: Objective, *, alpha: float = 0.0, budget: float | None = None,
              time_limit: float | None = None, timeout_seconds: float = 60.0, backend: str = "highs",
              start: dict[str, int] | None = None, cutoff: float | None = None) -> IlpResult:
    """Build the PuLP model, solve it, and extract the choice (raises InfeasibleError).

    ``start`` is a known feasible choice handed to the solver as its first incumbent. ``cutoff``
    (the objective's unit) asks only for a choice better than it: none is InfeasibleError, which
    often proved sooner than an optimum is found."""
    t0 = time.perf_counter()
    lp = pulp.LpProblem("parplan_aux", pulp.LpMinimize)
    X: dict[str, list[pulp.LpVariable]] = {}
    for k, node in problem.nodes.items():
        X[k] = [pulp.LpVariable(f"X_{_safe(k)}_{s}", cat=pulp.LpBinary) for s in range(len(node.memory))]
        if start is not None:
            for s, var in enumerate(X[k]):
                var.setInitialValue(1.0 if start[k] == s else 0.0)
        # (6) each operator takes exactly one strategy
        lp += pulp.lpSum(X[k]) == 1, f"one_strategy__{_safe(k)}"
    mem_terms: list[tuple[pulp.LpVariable, float]] = []
    sec_terms: list[tuple[pulp.LpVariable, float]] = []
    edge_vars: list[list[list[pulp.LpVariable]]] = []
    for k, node in problem.nodes.items():
        for s, var in enumerate(X[k]):
            mem_terms.append((var, node.count * node.memory[s] / _MEM))
            sec_terms.append((var, node.count * node.seconds[s]))
    grouped = {ei for g in problem.shared for ei in g}
    for ei, e in enumerate(problem.edges):
        ns, nt = len(e.seconds), len(e.seconds[0])
        B = [[pulp.LpVariable(f"B_{ei}_{s}_{t}", lowBound=0, upBound=1) for t in range(nt)] for s in range(ns)]
        edge_vars.append(B)
        if start is not None:
            cs, ct = e.cls("src", start[e.src]), e.cls("dst", start[e.dst])
            for s in range(ns):
                for t in range(nt):
                    B[s][t].setInitialValue(1.0 if (s, t) == (cs, ct) else 0.0)
        for t in range(nt):
            # (7) the consumer's chosen strategy (class) receives exactly one auxiliary edge of this edge
            lp += (pulp.lpSum(B[s][t] for s in range(ns))
                   == pulp.lpSum(x for k, x in enumerate(X[e.dst]) if e.cls("dst", k) == t)), f"edge_in__{ei}_{t}"
        for s in range(ns):
            # (8) the producer's chosen strategy (class) sends exactly one auxiliary edge of this edge
            lp += (pulp.lpSum(B[s][t] for t in range(nt))
                   == pulp.lpSum(x for k, x in enumerate(X[e.src]) if e.cls("src", k) == s)), f"edge_out__{ei}_{s}"
        for s in range(ns):
            for t in range(nt):
                if e.seconds[s][t] and ei not in grouped:
                    sec_terms.append((B[s][t], e.count * e.seconds[s][t]))
                if e.memory is not None and e.memory[s][t]:
                    mem_terms.append((B[s][t], e.count * e.memory[s][t] / _MEM))
    for gi, group in enumerate(problem.shared):
        Z = pulp.LpVariable(f"Z_shared_{gi}", lowBound=0)
        if start is not None:
            Z.setInitialValue(max(problem.edges[ei].seconds_of(start) for ei in group))
        sec_terms.append((Z, 1.0))
        for ei in group:
            e = problem.edges[ei]
            expr = [(edge_vars[ei][s][t], e.count * e.seconds[s][t]) for s in range(len(e.seconds))
                    for t in range(len(e.seconds[0])) if e.seconds[s][t]]
            if expr:
                # readers of one tensor share its conversion: the group costs its costliest edge
                lp += pulp.LpAffineExpression(expr) <= Z, f"shared__{gi}_{ei}"
    if problem.peaks:
        T = pulp.LpVariable("T_temporary_peak", lowBound=0)
        if start is not None:
            T.setInitialValue(problem.peak(start) / _MEM)
        mem_terms.append((T, 1.0))
        for pi, term in enumerate(problem.peaks):
            expr = [(X[k][s], v / _MEM) for k, vals in term.nodes.items() for s, v in enumerate(vals) if v]
            expr += [(edge_vars[ei][s][t], v / _MEM) for ei, vals in term.edges.items()
                     for s, row in enumerate(vals) for t, v in enumerate(row) if v]
            if expr:
                # the temporary peak is at least every set of buffers that coexist
                lp += pulp.LpAffineExpression(expr) <= T, f"peak__{pi}"
    mem_expr = pulp.LpAffineExpression(mem_terms)
    sec_expr = pulp.LpAffineExpression(sec_terms)
    if objective == "weighted":
        # (5) memory + alpha * time (alpha given in bytes per second)
        lp += mem_expr + (alpha / _MEM) * sec_expr
    elif objective == "time":
        lp += sec_expr
    else:
        lp += mem_expr
    if budget is not None:
        # memory per device within the budget
        lp += mem_expr <= budget / _MEM, "memory_budget"
    if time_limit is not None:
        # step time within (1 + epsilon) of the best
        lp += sec_expr <= time_limit, "time_limit"
    if cutoff is not None:
        # only a choice better than one already known is of interest
        lp += lp.objective <= cutoff / (1.0 if objective == "time" else _MEM), "better_than_known"
    status, gap, used = _run(lp, timeout_seconds, backend, warm=start is not None and cutoff is None)
    if status == "infeasible":
        raise InfeasibleError("no strategy assignment satisfies the constraints")
    choice = {k: max(range(len(v)), key=lambda s, v=v: v[s].value() or 0.0) for k, v in X.items()}  # type: ignore[misc]
    mem, sec = problem.totals(choice)
    obj = mem + alpha * sec if objective == "weighted" else (sec if objective == "time" else mem)
    return IlpResult(status, choice, mem, sec, obj, gap, time.perf_counter() - t0, used)


class _HiGHS(pulp.HiGHS):  # type: ignore[misc]
    """PuLP's highspy interface, optionally handing HiGHS the variables' initial values as a start."""

    def __init__(self, warm: bool, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.warm = warm

    def callSolver(self, lp: pulp.LpProblem) -> None:  # noqa: N802 - PuLP's name
        if self.warm:
            import highspy

            sol = highspy.HighsSolution()
            sol.col_value = [float(v.value() or 0.0) for v in lp.variables()]
            lp.solverModel.setSolution(sol)
        lp.solverModel.run()


def _run(lp: pulp.LpProblem, timeout_seconds: float, backend: str, warm: bool = False) -> tuple[
        Literal["optimal", "feasible", "infeasible"], float | None, str]:
    if backend == "highs" and "HiGHS" in pulp.listSolvers(onlyAvailable=True):
        solver = _HiGHS(warm, msg=False, timeLimit=timeout_seconds, threads=1)
        lp.solve(solver)
        model = lp.solverModel
        info = model.getInfo()
        status_text = model.modelStatusToString(model.getModelStatus()).lower()
        has_solution = info.primal_solution_status == 2  # kSolutionStatusFeasible
        if "infeasible" in status_text or (not has_solution and "time limit" not in status_text):
            return "infeasible", None, "highs"
        if not has_solution:
            raise SolverError(f"the ILP solver found no solution within the {timeout_seconds:g} s time limit; "
                              "raise the time limit")
        gap = float(info.mip_gap) if info.mip_gap < 1e30 else None
        return ("optimal" if status_text == "optimal" else "feasible"), gap, "highs"
    solver = pulp.PULP_CBC_CMD(msg=False, timeLimit=timeout_seconds)
    status = lp.solve(solver)
    if status == pulp.LpStatusInfeasible:
        return "infeasible", None, "cbc"
    if status != pulp.LpStatusOptimal:
        if any(v.value() is not None for v in lp.variables()):
            return "feasible", None, "cbc"
        raise SolverError(f"the ILP solver found no solution within the {timeout_seconds:g} s time limit")
    return "optimal", 0.0, "cbc"


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

"""The ILP's solvers: a formulation as arrays (:class:`Formulation`) solved by HiGHS, built directly
through highspy's arrays (building it through PuLP cost more than solving it), or by CBC through
PuLP, the fallback where highspy is missing. :mod:`.model` formulates; this module only solves."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from parplan.solver.errors import SolverError

Status = Literal["optimal", "feasible", "infeasible"]

#: A solve stops once its answer is proven within this fraction of the optimum (HiGHS's and CBC's
#: relative MIP gap; HiGHS's own default is 1e-4). Memory answers are then at most 0.2% above the
#: least; the plan reports the gap it reached. At 1e-3 a large memory solve (t5-11b) spent four
#: fifths of its time proving the last 0.1% and improved its answer by 0.001% (docs/notes/planning-speed.md). A
#: ``cutoff`` likewise asks only for a choice better than the known one by more than this fraction.
MIP_REL_GAP = 2e-3

#: The gap of a first, quick pass over several candidates' memory solves: it finds each one's near
#: least memory and a lower bound on it; only candidates whose bound leaves room for an answer better
#: than the best by more than MIP_REL_GAP are solved again to that gap (:mod:`.search`). A memory
#: solve's incumbent usually comes from the root's rounding within this gap; most of a tight solve
#: is the cutting that proves the last few tenths of a percent.
SCREEN_REL_GAP = 1e-2

#: HiGHS options besides the defaults:
#:
#: - presolve and root restarts off: the models come out of :func:`~.model.formulate` with little
#:   left for presolve to remove, and restarting the root after fixing columns repeats most of a
#:   solve. Without them the large ILP cases solve in 0.57 to 0.71 of the time with the same memory
#:   (docs/notes/planning-speed.md); where several plans hold the same memory within the gap, the solver may
#:   return another of them. The two go together: with restarts alone off, t5-11b's solve runs out
#:   of its time limit.
#: - the feasibility-jump heuristic off: it does not give the answer on these models (the root LP of
#:   a time solve is integral; memory solves get their incumbents from rounding and sub-MIPs) and
#:   costs about 0.6 s of a large solve before the first LP.
#: - RINS and RENS off: their sub-MIPs run HiGHS's presolve, whose inequality strengthening
#:   (``HPresolve::strengthenInequalities``, HiGHS 1.16) can loop without end and without looking
#:   at the time limit or ``cancelSolve`` (tests/data/highs_presolve_hang.mps.gz, a memory solve of
#:   gpt-3.6b on 8 A100s; HiGHS's own issue 2226 reports a like loop). With them and presolve off,
#:   no presolve runs at all.
HIGHS_OPTIONS: dict[str, str | bool] = {"presolve": "off", "mip_allow_restart": False,
                                         "mip_heuristic_run_feasibility_jump": False,
                                         "mip_heuristic_run_rins": False, "mip_heuristic_run_rens": False}


@dataclass
class Formulation:
    """The model as arrays: columns (cost, bounds, binary or not) and rows (sparse, with bounds).

    One formulation feeds both backends (HiGHS directly, CBC through PuLP); rows carry the name and
    formula they encode."""

    cost: list[float] = field(default_factory=list)
    lower: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)
    binary: list[bool] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    row_lower: list[float] = field(default_factory=list)
    row_upper: list[float] = field(default_factory=list)
    row_start: list[int] = field(default_factory=lambda: [0])
    row_index: list[int] = field(default_factory=list)
    row_value: list[float] = field(default_factory=list)
    row_names: list[str] = field(default_factory=list)
    start: list[float] | None = None

    def col(self, name: str, lower: float = 0.0, upper: float = 1.0, binary: bool = False) -> int:
        self.names.append(name)
        self.cost.append(0.0)
        self.lower.append(lower)
        self.upper.append(upper)
        self.binary.append(binary)
        return len(self.names) - 1

    def row(self, name: str, terms: Sequence[tuple[int, float]], lower: float, upper: float) -> None:
        merged: dict[int, float] = {}
        for j, v in terms:
            merged[j] = merged.get(j, 0.0) + v
        for j, v in merged.items():
            if v:
                self.row_index.append(j)
                self.row_value.append(v)
        self.row_start.append(len(self.row_index))
        self.row_lower.append(lower)
        self.row_upper.append(upper)
        self.row_names.append(name)

    @property
    def size(self) -> tuple[int, int, int]:
        """(variables, constraints, nonzeros)."""
        return len(self.names), len(self.row_names), len(self.row_index)



def _highs_available() -> bool:
    try:
        import highspy  # noqa: F401
    except ImportError:
        return False
    return True


def _new_highs() -> Any:
    """A silent HiGHS instance. HiGHS logs its banner ("Running HiGHS ...") at the first call on an
    instance while ``output_flag`` is on, and highspy's ``Highs()`` makes that call in its own
    constructor (it enables its Python callbacks, which parplan does not use). HiGHS's maintainers'
    way to silence it is to turn ``output_flag`` off before any other call (ERGO-Code/HiGHS issue
    1702), so the instance is highspy's C++ class ``_Highs``, which the Python one wraps, and its
    first call turns the output off. A highspy without that class gets its public ``Highs`` (the
    banner then shows once)."""
    try:
        from highspy._core import _Highs
    except ImportError:
        from highspy import Highs as _Highs

    h = _Highs()
    h.setOptionValue("output_flag", False)
    return h


def run(f: Formulation, timeout_seconds: float, backend: str, warm: bool = False,
        gap: float = MIP_REL_GAP) -> tuple[Status, float | None, str, list[float]]:
    """Solve ``f`` with ``backend`` ("highs", else CBC; CBC too where highspy is missing) to the
    relative ``gap``: (status, gap reached or None, the backend used, column values). ``warm``:
    start from ``f.start``."""
    if backend == "highs" and _highs_available():
        return _run_highs(f, timeout_seconds, warm, gap)
    return _run_cbc(f, timeout_seconds, gap)


def configured_highs(timeout_seconds: float, gap: float = MIP_REL_GAP) -> Any:
    """A silent HiGHS instance with parplan's settings: the time limit (seconds), one thread, the
    relative ``gap`` and :data:`HIGHS_OPTIONS`."""
    h = _new_highs()
    h.setOptionValue("time_limit", float(timeout_seconds))
    h.setOptionValue("threads", 1)
    h.setOptionValue("mip_rel_gap", gap)
    for option, value in HIGHS_OPTIONS.items():
        if h.setOptionValue(option, value) != _highs_ok():
            raise SolverError(f"HiGHS refused its option {option}={value!r}")
    return h


def _highs_ok() -> Any:
    import highspy

    return highspy.HighsStatus.kOk


def _run_highs(f: Formulation, timeout_seconds: float, warm: bool, gap: float) -> tuple[
        Status, float | None, str, list[float]]:
    import highspy
    import numpy as np

    h = configured_highs(timeout_seconds, gap)
    inf = h.getInfinity()
    n = len(f.names)

    def clip(xs: list[float]) -> Any:
        return np.clip(np.array(xs, dtype=np.float64), -inf, inf)

    h.addVars(n, clip(f.lower), clip(f.upper))
    h.changeColsCost(n, np.arange(n, dtype=np.int32), np.array(f.cost, dtype=np.float64))
    binaries = np.array([j for j, b in enumerate(f.binary) if b], dtype=np.int32)
    if len(binaries):
        h.changeColsIntegrality(len(binaries), binaries,
                                np.full(len(binaries), highspy.HighsVarType.kInteger, dtype=np.uint8))
    h.addRows(len(f.row_names), clip(f.row_lower), clip(f.row_upper), len(f.row_index),
              np.array(f.row_start[:-1], dtype=np.int32), np.array(f.row_index, dtype=np.int32),
              np.array(f.row_value, dtype=np.float64))
    if warm and f.start is not None:
        sol = highspy.HighsSolution()
        sol.col_value = list(f.start)
        h.setSolution(sol)
    h.run()
    info = h.getInfo()
    status_text = h.modelStatusToString(h.getModelStatus()).lower()
    has_solution = info.primal_solution_status == 2  # kSolutionStatusFeasible
    if "infeasible" in status_text or (not has_solution and "time limit" not in status_text):
        return "infeasible", None, "highs", []
    if not has_solution:
        raise SolverError(f"the ILP solver found no solution within the {timeout_seconds:g} s time limit; "
                          "raise the time limit")
    reached = float(info.mip_gap) if info.mip_gap < 1e30 else None
    values = list(h.getSolution().col_value)
    return ("optimal" if status_text == "optimal" else "feasible"), reached, "highs", values


def _run_cbc(f: Formulation, timeout_seconds: float, gap: float) -> tuple[
        Status, float | None, str, list[float]]:
    import pulp

    lp = pulp.LpProblem("parplan_aux", pulp.LpMinimize)
    cols = [pulp.LpVariable(name, lowBound=lo if lo > -math.inf else None, upBound=up if up < math.inf else None,
                            cat=pulp.LpBinary if b else pulp.LpContinuous)
            for name, lo, up, b in zip(f.names, f.lower, f.upper, f.binary, strict=True)]
    lp += pulp.LpAffineExpression([(cols[j], v) for j, v in enumerate(f.cost) if v])
    for r, name in enumerate(f.row_names):
        expr = pulp.LpAffineExpression([(cols[f.row_index[i]], f.row_value[i])
                                        for i in range(f.row_start[r], f.row_start[r + 1])])
        lo, up = f.row_lower[r], f.row_upper[r]
        if lo == up:
            lp += expr == up, name
        else:
            if up < math.inf:
                lp += expr <= up, name
            if lo > -math.inf:
                lp += expr >= lo, name + "__lower"
    status = lp.solve(pulp.PULP_CBC_CMD(msg=False, timeLimit=timeout_seconds, gapRel=gap))
    values = [float(c.value() or 0.0) for c in cols]
    if status == pulp.LpStatusInfeasible:
        return "infeasible", None, "cbc", []
    if status != pulp.LpStatusOptimal:
        if any(c.value() is not None for c in cols):
            return "feasible", None, "cbc", values
        raise SolverError(f"the ILP solver found no solution within the {timeout_seconds:g} s time limit")
    return "optimal", gap, "cbc", values  # CBC reports no gap: the one it was asked to reach bounds it

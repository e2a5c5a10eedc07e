"""Gates in the ILP (:class:`parplan.solver.ilp.model.Gate`): a node's bytes held only while any of
some strategies of other nodes is chosen (an OR, linearised with a binary and the standard
constraints for a product of binaries). Oracles: brute force over every choice, with each gate
evaluated directly (open when any of its strategies is chosen), and the warm start satisfying
every row of the model it is written into."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parplan.solver.ilp.model import (
    MIP_REL_GAP,
    AuxNode,
    AuxProblem,
    Gate,
    PeakTerm,
    brute_force,
    formulate,
    solve_aux,
)

GIB = 2**30


@st.composite
def gated_problems(draw: st.DrawFn) -> tuple[AuxProblem, dict[str, int]]:
    """<= 5 nodes of <= 4 strategies, 1-3 gates, 1-3 moments holding some nodes' bytes and some
    gates (with positive coefficients, as the step's walk holds a kept gradient); and a choice."""
    n = draw(st.integers(2, 5))
    sizes = [draw(st.integers(1, 4)) for _ in range(n)]
    cost = st.floats(0, 10, allow_nan=False)
    p = AuxProblem()
    for i, k in enumerate(sizes):
        p.nodes[f"v{i}"] = AuxNode(f"v{i}", [draw(cost) * GIB for _ in range(k)], [draw(cost) for _ in range(k)])
    for _ in range(draw(st.integers(1, 3))):
        owner = draw(st.integers(0, n - 1))
        opens = draw(st.sets(st.integers(0, n - 1), min_size=0, max_size=3))
        when = {f"v{i}": tuple(sorted(draw(st.sets(st.integers(0, sizes[i] - 1), min_size=1)))) for i in sorted(opens)}
        p.gate(Gate(f"v{owner}", [draw(cost) * GIB for _ in range(sizes[owner])], when))
    for _ in range(draw(st.integers(1, 3))):
        names = draw(st.sets(st.integers(0, n - 1), max_size=2))
        gates = draw(st.sets(st.integers(0, len(p.gates) - 1), min_size=1))
        p.peaks.append(PeakTerm(nodes={f"v{i}": [draw(cost) * GIB for _ in range(sizes[i])] for i in sorted(names)},
                                gates={g: draw(st.sampled_from([0.5, 1.0, 2.0])) for g in sorted(gates)}))
    choice = {f"v{i}": draw(st.integers(0, k - 1)) for i, k in enumerate(sizes)}
    return p, choice


def test_a_gate_is_its_nodes_value_while_any_opening_strategy_is_chosen() -> None:
    g = Gate("owner", [3.0, 5.0], {"owner": (1,), "reader": (0, 2)})
    assert g.value({"owner": 0, "reader": 1}) == 0.0  # neither opens it
    assert g.value({"owner": 1, "reader": 1}) == 5.0  # the owner's own strategy opens it
    assert g.value({"owner": 0, "reader": 2}) == 3.0  # a reader's opens it, at the owner's value
    assert g.value({"owner": 1, "reader": 0}) == 5.0  # both: still once
    p = AuxProblem()
    assert p.gate(g) == 0 and p.gate(Gate("owner", [3.0, 5.0], {"owner": (1,), "reader": (0, 2)})) == 0
    assert p.gate(Gate("owner", [3.0, 6.0], {"owner": (1,)})) == 1


@settings(max_examples=15, deadline=None)
@given(gated_problems(), st.floats(0.01, 5))
def test_the_ilp_with_gates_equals_brute_force(case: tuple[AuxProblem, dict[str, int]], alpha: float) -> None:
    p, _ = case
    least = brute_force(p, "memory")
    assert least is not None and p.memory_lower_bound() <= least[0] * (1 + 1e-12) + 1e-6
    for objective, kwargs in (("memory", {}), ("weighted", {"alpha": alpha * GIB})):
        oracle = brute_force(p, objective, **kwargs)  # type: ignore[arg-type]
        got = solve_aux(p, objective, **kwargs)  # type: ignore[arg-type]
        assert oracle is not None
        assert oracle[0] - 1e-6 <= got.objective <= oracle[0] + MIP_REL_GAP * abs(oracle[0]) + 1e-6
        assert p.totals(got.choice)[0] == pytest.approx(got.memory)


@settings(max_examples=30, deadline=None)
@given(gated_problems())
def test_a_warm_start_satisfies_every_row_and_prices_the_choice(case: tuple[AuxProblem, dict[str, int]]) -> None:
    """The start values (one per column, in the order the columns are made) meet every row, the
    gates' rows included, and the temporary peak's column is the choice's peak."""
    p, choice = case
    f, _ = formulate(p, "memory", start=choice)
    assert f.start is not None and len(f.start) == len(f.names)
    for r, name in enumerate(f.row_names):
        lo, hi = f.row_start[r], f.row_start[r + 1]
        activity = sum(f.row_value[k] * f.start[f.row_index[k]] for k in range(lo, hi))
        assert f.row_lower[r] - 1e-9 <= activity <= f.row_upper[r] + 1e-9, name
    assert f.start[f.names.index("T_temporary_peak")] * GIB == pytest.approx(p.peak(choice), abs=1e-3)

"""The step's timeline (parplan/solver/cost/timeline.py) is one walk over two quantities: bytes for the
whole-plan evaluator (cost/peak.py) and linear expressions of the operators' strategies for the ILP
(ilp/moments.py). The oracle here: the ILP's linear moments evaluated at a choice equal the walk
over numbers at that choice (every unit's figures evaluated first, each unit's inner moments taken
at their largest, each unit gathering or not as the choice has it), on choices the search could make
(any candidate per operator, not only uniform strategies; on the torch runtimes with two micro-steps
the ILP's own moments accumulate, a tied table's kept gradient an OR over its readers' choices), and
on the cases of the walk the ILP's plans leave out (pipelining, gradients made in backward) too.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parplan.solver.calibration import DEFAULT_CALIBRATION
from parplan.solver.cluster import make_cluster
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.peak import stage_peak
from parplan.solver.cost.precision import get_precision
from parplan.solver.cost.runtime import Runtime
from parplan.solver.cost.timeline import StepOptions
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.presets import get_preset
from parplan.solver.ilp import moments
from parplan.solver.ilp.graph_problem import GraphProblem
from parplan.solver.ilp.problem import build_problem
from parplan.solver.ilp.search import mesh_links
from parplan.solver.ilp.strategies import Mesh
from parplan.solver.ilp.terms import LINEAR, Lin, lin_sum


def _problem(family: str, layers: int, mesh: tuple[int, ...], recompute: Recompute, runtime: Runtime,
             flash: bool) -> GraphProblem:
    cfg = get_preset(family).with_(layers=layers, hidden=128, heads=4, kv_heads=None, head_dim=None, ffn=512,
                                   vocab=512, seq_len=64)
    m = Mesh(tuple((f"m{i}", s) for i, s in enumerate(mesh)))
    cluster = make_cluster(m.num_devices, 8, "A100-80GB")
    return build_problem(build_graph(cfg, batch=4), m, mesh_links(cluster, m), cluster.gpu, DEFAULT_CALIBRATION,
                         get_precision("fp32"), 2, recompute, flash, prune=False, runtime=runtime)


def _choice(gp: GraphProblem, seed: int, zero: int | None = None) -> dict[str, int]:
    """A candidate per variable set at random (with ``zero``: of those with that ZeRO stage where
    an operator owns parameters, so that every unit gathers or none does)."""
    rng = random.Random(seed)
    out = {}
    for rep, cands in gp.strategies.items():
        owns = bool(gp.ctx.owned_params.get(rep))
        pool = [k for k, s in enumerate(cands) if zero is None or not owns or s.zero == zero]
        out[rep] = rng.choice(pool or list(range(len(cands))))
    return out


def _value(gp: GraphProblem, x: Lin, choice: dict[str, int]) -> float:
    return x.term().value(gp.problem, choice)


_Problem = tuple[str, int, tuple[int, ...], Recompute, Runtime, bool]
_problems = st.tuples(st.sampled_from(["gpt-1.7b", "llama-2-7b", "bert-large"]), st.integers(1, 3),
                      st.sampled_from([(2,), (4,), (2, 2)]), st.sampled_from(list(Recompute)),
                      st.sampled_from([Runtime.MEGATRON, Runtime.TORCH, Runtime.TORCH_CPU]), st.booleans())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=_problems, seed=st.integers(0, 2**16))
def test_the_ilps_moments_at_any_choice_are_the_numeric_walk_at_it(problem: _Problem, seed: int) -> None:
    """Every moment (and the dominant ones the problem keeps), the temporaries, at a random choice."""
    gp = _problem(*problem)
    choice = _choice(gp, seed)
    above, temporary = moments.walk_peak(gp, choice)
    fixed = gp.problem.fixed_bytes
    terms, units = moments._terms_and_units(gp)
    optimizer = [_value(gp, o, choice) for o in moments._optimizer(terms, units)]
    every = max([_value(gp, m.total(LINEAR), choice) for m in moments._moments(gp, terms, units)] + optimizer)
    assert every + fixed == pytest.approx(above, rel=1e-9)
    assert gp.problem.peak(choice) + fixed == pytest.approx(above, rel=1e-9)
    assert max(t.value(gp.problem, choice) for t in gp.temporary_terms) + fixed == pytest.approx(temporary, rel=1e-9)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problem=_problems, seed=st.integers(0, 2**16), zero=st.sampled_from([0, 3]),
       how=st.sampled_from(["accumulating", "pipelined", "created", "created-later"]))
def test_the_walk_over_linear_terms_covers_every_case_of_the_step(problem: _Problem, seed: int, zero: int,
                                                                  how: str) -> None:
    """Accumulation (FSDP2 keeping every unsharded gradient), pipelining (and every block's weights
    gathered), gradients made in backward (torchtitan; on the first micro-batch or a later one):
    the walk over linear terms, evaluated at a choice where every unit gathers or none does, is the
    walk over the numbers at that choice."""
    gp = _problem(*problem)
    choice = _choice(gp, seed, zero)
    terms, units = moments._terms_and_units(gp)
    at = moments.stage_at(gp, choice)
    created = [u.grads for u in units] if how.startswith("created") else None
    shared = lin_sum(u.grads for u in units if u.tied_user) if created else None
    options = StepOptions(accumulating=how in ("accumulating", "pipelined"), pipelined=how == "pipelined",
                          created_grads=created, shared_grads=shared, later_microbatches=how == "created-later")
    linear = [(_value(gp, m.total(LINEAR), choice), _value(gp, m.temporaries(LINEAR), choice))
              for m in moments._moments(gp, terms, units, options=options)]
    numeric = stage_peak(at.units, gp.ctx.precision, at.shared_act, at.tied_elems, at.tied_workspace_elems,
                         accumulating=options.accumulating, pipelined=options.pipelined,
                         created_grads=None if created is None else [_value(gp, g, choice) for g in created],
                         shared_grads=0.0 if shared is None else _value(gp, shared, choice),
                         later_microbatches=options.later_microbatches)
    assert max(t for t, _ in linear) == pytest.approx(numeric.above_resident, rel=1e-9)
    assert max(t for _, t in linear) == pytest.approx(numeric.temporary, rel=1e-9)

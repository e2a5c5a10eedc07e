"""The bounds that let the ILP search skip work are lower bounds.

``least_bytes`` (known before a problem is built: every parameter's states and saved buffer cut
over every device) decides that a micro-step size is not built at all, and with the peak's terms
:meth:`AuxProblem.memory_lower_bound` decides that a memory solve is not run; ``seconds_lower_bound``
decides that a time solve is not run. The oracle is the solver's own optimum of the same problem:
no choice holds less memory (takes less time) than it, to within the solver's gap, so a bound
above it would have skipped the answer."""

from __future__ import annotations

import pytest

from parplan.solver.calibration import DEFAULT_CALIBRATION
from parplan.solver.cluster import make_cluster
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.precision import get_precision
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.presets import get_preset
from parplan.solver.ilp.model import solve_aux
from parplan.solver.ilp.problem import build_problem, least_bytes
from parplan.solver.ilp.search import mesh_links
from parplan.solver.ilp.strategies import Mesh

MODELS = {
    "gpt": get_preset("gpt-1.7b").with_(name="gpt-tiny", layers=2, hidden=128, heads=4, ffn=512, vocab=512,
                                        seq_len=64),
    "llama": get_preset("llama-3-8b").with_(name="llama-tiny", layers=2, hidden=128, heads=4, kv_heads=2, ffn=344,
                                            vocab=512, seq_len=64),
}


@pytest.mark.parametrize("family", sorted(MODELS))
@pytest.mark.parametrize("recompute", [Recompute.SELECTIVE, Recompute.FULL, Recompute.OP])
@pytest.mark.parametrize(("mesh_shape", "batch"), [((2,), 1), ((2,), 4), ((2, 2), 2), ((2, 2), 8)])
def test_the_search_bounds_are_below_the_optimum(family: str, recompute: Recompute, mesh_shape: tuple[int, ...],
                                                 batch: int) -> None:
    devices = 1
    for size in mesh_shape:
        devices *= size
    cluster = make_cluster(devices, devices, "A100-80GB")
    mesh = Mesh(tuple((f"m{i}", size) for i, size in enumerate(mesh_shape)))
    graph = build_graph(MODELS[family], batch=batch)
    prec = get_precision("bf16")
    gp = build_problem(graph, mesh, mesh_links(cluster, mesh), cluster.gpu, DEFAULT_CALIBRATION, prec, 2, recompute,
                       True)
    least = solve_aux(gp.problem, "memory")
    fastest = solve_aux(gp.problem, "time")
    floor = least_bytes(graph, devices, prec, recompute, True)
    assert 0 < floor <= least.memory
    gp.problem.floor_bytes = 0.0
    assert gp.problem.memory_lower_bound() <= least.memory  # the peak's terms alone
    # (the optimum is within MIP_REL_GAP below the answer: a bound above it by less goes unseen)
    assert 0 < gp.problem.seconds_lower_bound() <= fastest.seconds

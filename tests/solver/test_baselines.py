"""The baselines price memory only where it can change the answer, and the answer is the same.

:func:`fastest_fitting` prices every configuration's step time but memory only in order of time
until one fits; the oracle, :func:`best_of`, prices both for every configuration of the family."""

from __future__ import annotations

import pytest

from parplan.solver.baselines import BASELINES, UniformEvaluator, _family, baseline, best_of
from parplan.solver.cluster import make_cluster
from parplan.solver.cost.pipeline import blocks_of
from parplan.solver.models import resolve_model

GIB = 2**30


@pytest.mark.parametrize(("model", "gpus", "batch"), [("gpt-1.7b", 8, 16), ("llama-2-7b", 16, 64),
                                                      ("bert-large", 4, 4), ("mixtral-8x7b", 16, 32)])
@pytest.mark.parametrize("budget_gib", [80.0, 4.0])
def test_lazy_baselines_equal_every_configuration_priced(model: str, gpus: int, batch: int,
                                                         budget_gib: float) -> None:
    source = resolve_model(model)
    cluster = make_cluster(gpus, 8, "A100-80GB")
    ev = UniformEvaluator(source, cluster, batch, None)
    blocks = len(blocks_of(ev.graph(1)))
    for name in BASELINES:
        got = baseline(name, ev, budget_gib * GIB, blocks)
        oracle = UniformEvaluator(source, cluster, batch, None)
        want = best_of((e for c in _family(name, cluster, batch, blocks) if (e := oracle.evaluate(c)) is not None),
                       budget_gib * GIB)
        if want is None:
            assert got is None
            continue
        assert got is not None
        assert got.strategy == want.strategy, name
        assert (got.memory, got.time) == (want.memory, want.time)
    if budget_gib == 80.0:  # every family has a configuration that fits: few memories are priced
        assert ev.memory_evaluations * 4 < ev.evaluations

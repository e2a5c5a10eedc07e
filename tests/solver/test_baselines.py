"""The baselines price memory only where it can change the answer, and the answer is the same.

:func:`fastest_fitting` prices every configuration's step time but memory only in order of time
until one fits; the oracle, :func:`best_of`, prices both for every configuration of the family."""

from __future__ import annotations

import pytest

from parplan.solver.baselines import BASELINES, UniformEvaluator, _family, baseline, best_of, enumerate_uniform
from parplan.solver.cluster import make_cluster
from parplan.solver.cost.pipeline import blocks_of
from parplan.solver.cost.runtime import Runtime
from parplan.solver.models import resolve_model
from parplan.solver.targets import Target, family

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
        family = _family(name, cluster, batch, blocks, ev.runtime)
        want = best_of((e for c in family if (e := oracle.evaluate(c)) is not None), budget_gib * GIB)
        if want is None:
            assert got is None
            continue
        assert got is not None
        assert got.strategy == want.strategy, name
        assert (got.memory, got.time) == (want.memory, want.time)
    if budget_gib == 80.0:  # every family has a configuration that fits: few memories are priced
        family = {c for name in BASELINES for c in _family(name, cluster, batch, blocks, ev.runtime)}
        assert ev.memory_evaluations * 4 < len(family)
        assert ev.evaluations < len(family)  # and not every step time (the least possible time rules some out)


@pytest.mark.parametrize(("model", "gpus", "batch"), [("gpt-1.7b", 8, 16), ("llama-2-7b", 16, 64),
                                                      ("bert-large", 4, 4), ("mixtral-8x7b", 16, 32),
                                                      ("t5-11b", 8, 16)])
@pytest.mark.parametrize("runtime", [Runtime.MEGATRON, Runtime.TORCH, Runtime.DEEPSPEED])
def test_the_least_possible_time_is_never_above_the_step(model: str, gpus: int, batch: int,
                                                         runtime: Runtime) -> None:
    """What lets :func:`fastest_fitting` leave configurations unpriced: every configuration the
    baselines and the targets' families enumerate (TP, PP, DP, ZeRO 0-3, SP, recomputation,
    micro-batches, interleaved schedules, expert parallelism), priced, takes at least
    :meth:`UniformEvaluator.time_floor`."""
    source = resolve_model(model)
    cluster = make_cluster(gpus, 8, "A100-80GB")
    ev = UniformEvaluator(source, cluster, batch, None, runtime=runtime)
    blocks = len(blocks_of(ev.graph(1)))
    experts = 8 if model.startswith("mixtral") else 0
    cands = set(enumerate_uniform(cluster, batch, blocks))
    cands |= set(family(Target.MEGATRON, cluster, batch, blocks, experts))
    assert any(c.virtual > 1 for c in cands) and (not experts or any(c.ep > 1 for c in cands))
    priced = 0
    for c in sorted(cands, key=repr):
        t = ev.time_of(c)
        if t is None:
            continue
        priced += 1
        assert ev.time_floor(c) <= t.step_seconds, c
    assert priced > 20


@pytest.mark.parametrize(("model", "gpus", "batch"), [("gpt-1.7b", 8, 16), ("mixtral-8x7b", 16, 32),
                                                      ("t5-11b", 8, 16)])
@pytest.mark.parametrize(("runtime", "precision"), [(Runtime.MEGATRON, "bf16"), (Runtime.MEGATRON, "fp8"),
                                                    (Runtime.TORCHTITAN, "bf16"), (Runtime.TORCHTITAN, "fp8-torchao"),
                                                    (Runtime.DEEPSPEED, "bf16"), (Runtime.NANOTRON, "bf16")])
def test_the_least_possible_memory_is_never_above_the_peak(model: str, gpus: int, batch: int, runtime: Runtime,
                                                            precision: str) -> None:
    """What lets the searches leave memory unpriced: every configuration the baselines and the
    targets' families enumerate (every tenth, in a fixed order), priced, holds at least
    :meth:`UniformEvaluator.memory_floor`; torchtitan's gradients, made in backward, are not alive
    with the activations, so its floor does not add them (adding them puts it above the peak of
    gpt-1.7b at tp1 dp8 without recomputation)."""
    source = resolve_model(model)
    cluster = make_cluster(gpus, 8, "A100-80GB")
    ev = UniformEvaluator(source, cluster, batch, None, runtime=runtime, precision=precision)
    blocks = len(blocks_of(ev.graph(1)))
    experts = 8 if model.startswith("mixtral") else 0
    cands = set(enumerate_uniform(cluster, batch, blocks))
    cands |= set(family(Target.MEGATRON, cluster, batch, blocks, experts))
    cands |= set(family(Target.TORCHTITAN, cluster, batch, blocks))
    priced, closest = 0, 0.0
    for c in sorted(cands, key=repr)[::10]:
        m = ev.memory_of(c)
        if m is None:
            continue
        priced += 1
        floor = ev.memory_floor(c)
        assert floor <= m.peak_bytes, c
        closest = max(closest, floor / m.peak_bytes)
    assert priced > 10 and closest > 0.5  # a floor never close to the peak would prune nothing

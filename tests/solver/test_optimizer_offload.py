"""Optimizer offloading (:mod:`parplan.solver.cost.offload`) against closed forms written from the
runtimes' code, not from the model.

Megatron-LM's ``HybridDeviceOptimizer`` (``megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py``)
gets the distributed optimizer's shard of a rank's parameters, ``psi / d`` elements under ZeRO-1 over
``d`` ranks, and moves ``F`` of them to the host (``_get_sub_optimizer_param_groups``): there each has an
fp32 master copy (``param_update_in_fp32``, 4 bytes), an fp32 gradient buffer (``_set_sub_optimizer_grads``:
``torch.empty(param.shape, dtype=param.dtype)`` of the fp32 copy, 4 bytes) and Adam's two fp32 moments
(8 bytes); the rest keep their master and moments on the GPU (12 bytes). So, per rank:

    device optimizer states = (1 - F) * psi / d * 12
    host bytes              = F * psi / d * (4 + 4 + 8)

and a machine of ``d`` ranks holds ``d`` times the host bytes. Per step the offloaded elements' gradients
(fp32, 4 bytes) go to the host and their bf16 weights (2 bytes) come back over the GPU's host link, and
the host's CPUs step ``d * F * psi / d`` elements of Adam.
"""

from __future__ import annotations

import pytest

from parplan.solver.cluster import make_cluster
from parplan.solver.cost.offload import CPU_ADAM_ELEMENTS_PER_S
from parplan.solver.cost.runtime import Runtime
from parplan.solver.errors import StrategyError
from parplan.solver.evaluate import evaluate_graph
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.ir import Graph
from parplan.solver.result import Evaluation
from parplan.solver.strategy import ParallelConfig

D = 4  # data-parallel ranks, one machine


def _graph() -> Graph:
    return build_graph(TransformerConfig("gpt", "t", 4, 1024, 16, 4096, 32000, 512), batch=1)


def _evaluate(fraction: float, host_memory_gib: float | None = None, runtime: Runtime = Runtime.MEGATRON) -> Evaluation:
    g = _graph()
    cluster = make_cluster(D, None, "H100-80GB", host_memory_gib=host_memory_gib)
    cfg = ParallelConfig(dp=D, zero=1, runtime=runtime, optimizer_offload=fraction)
    return evaluate_graph(g, "t", g.parameter_count(), cluster, cfg)


@pytest.mark.parametrize("fraction", [0.25, 0.5, 1.0])
def test_device_and_host_bytes_are_the_hybrid_optimizers(fraction: float) -> None:
    psi = _graph().parameter_count()
    base, off = _evaluate(0.0), _evaluate(fraction)
    stage0, stage = base.memory.stages[0], off.memory.stages[0]
    assert stage0.memory.bytes.optimizer_states == pytest.approx(psi / D * 12)
    assert stage.memory.bytes.optimizer_states == pytest.approx((1 - fraction) * psi / D * 12)
    assert stage.host_bytes == pytest.approx(fraction * psi / D * 16)
    # the states are resident all step: the peak falls by exactly what left the device
    assert base.memory.peak_bytes - off.memory.peak_bytes == pytest.approx(fraction * psi / D * 12)
    host = off.host
    assert host is not None and host.bytes_per_host == pytest.approx(D * fraction * psi / D * 16)
    doc = off.to_dict()["memory"]
    assert doc["host_bytes_per_node"] == round(D * fraction * psi / D * 16)
    assert doc["host_memory_bytes"] == 2 * 10**12 and doc["host_fits"] and doc["host_reason"] is None


def test_fraction_zero_is_the_plan_without_offloading() -> None:
    base = _evaluate(0.0)
    assert base.host is None
    doc = base.to_dict()
    assert "host_bytes_per_node" not in doc["memory"] and "optimizer_offload" not in doc["strategy"]
    assert base.memory.stages[0].host_bytes == 0.0


def test_step_time_adds_the_copies_and_the_cpu_step() -> None:
    psi = _graph().parameter_count()
    times = [_evaluate(f).time for f in (0.0, 0.5, 1.0)]
    assert times[0].step_seconds < times[1].step_seconds < times[2].step_seconds  # monotone in the fraction
    gpu_step = times[0].stages[0].optimizer_seconds
    for f, t in zip((0.5, 1.0), times[1:], strict=True):
        elems = f * psi / D
        host = elems * (4 + 2) / 64e9 + D * elems / CPU_ADAM_ELEMENTS_PER_S  # PCIe Gen5 x16, 4 ranks' CPU step
        assert t.stages[0].optimizer_seconds == pytest.approx((1 - f) * gpu_step + host)
        assert t.step_seconds - times[0].step_seconds == pytest.approx((1 - f) * gpu_step + host - gpu_step)


def test_over_the_host_memory_does_not_fit_and_says_why() -> None:
    psi = _graph().parameter_count()
    limit_gib = psi * 16 / 2**30 / 2  # half what the offloaded optimizer of the machine needs
    ev = _evaluate(1.0, host_memory_gib=limit_gib)
    assert not ev.fits
    doc = ev.to_dict()["memory"]
    assert not doc["fits"] and not doc["host_fits"] and "host memory" in doc["host_reason"]
    assert _evaluate(1.0).fits


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"dp": 4, "zero": 0, "optimizer_offload": 0.5}, "distributed optimizer"),
    ({"dp": 4, "zero": 1, "optimizer_offload": 1.5}, "[0, 1]"),
    ({"dp": 4, "zero": 1, "runtime": Runtime.DEEPSPEED, "optimizer_offload": 0.5}, "ZeRO-Offload"),
    ({"dp": 4, "zero": 0, "runtime": Runtime.DEEPSPEED, "optimizer_offload": 1.0}, "ZeRO 1-3"),
    ({"dp": 4, "zero": 3, "runtime": Runtime.TORCHTITAN, "optimizer_offload": 1.0}, "CPUOffloadPolicy"),
])
def test_what_the_runtimes_refuse(kwargs: dict[str, object], words: str) -> None:
    with pytest.raises(StrategyError, match=words.replace("[", r"\[").replace("]", r"\]")):
        ParallelConfig(**kwargs)  # type: ignore[arg-type]


def test_deepspeed_offloads_the_whole_optimizer() -> None:
    psi = _graph().parameter_count()
    stage = _evaluate(1.0, runtime=Runtime.DEEPSPEED).memory.stages[0]
    assert stage.memory.bytes.optimizer_states == 0.0
    assert stage.host_bytes == pytest.approx(psi / D * 16)


def _plan(memory_gib: float, offload: bool) -> dict[str, object]:
    from parplan.solver.planner import solve
    from parplan.solver.request import parse_plan_request

    body = {"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": 2, "gpu": "A100-80GB", "gpu_memory_gib": memory_gib},
            "training": {"global_batch": 8, "optimizer_offload": offload}, "objective": {"kind": "max-throughput"},
            "target": "megatron"}
    return solve(parse_plan_request(body))


def test_the_search_offloads_only_when_nothing_fits_without() -> None:
    # 18 GiB: a plan fits without offloading; the search's answer and its work are the same either way
    on, off = _plan(18, True), _plan(18, False)
    assert on["strategy"] == off["strategy"] and on["solver"]["work"] == off["solver"]["work"]  # type: ignore[index]
    assert "offload" not in on["strategy"]["summary"]  # type: ignore[index]
    # 14 GiB: nothing fits without; with part of the optimizer on the host a plan does
    assert _plan(14, False)["strategy"] is None
    found = _plan(14, True)["strategy"]
    assert found is not None and found["optimizer_offload"] in (0.5, 1.0) and found["zero"] == 1  # type: ignore[index]

"""The agent's matmul benchmark becomes the time model's GEMM ceilings: pricing the timed matmul
with the calibration it produces gives back the measured time (the oracle: the measurement the
calibration was made from), and a dtype the preset has no peak for is left out."""

from __future__ import annotations

import pytest

from parplan.agent.microbench import CUDA_MATMUL_N, matmul_ceilings
from parplan.solver.calibration import Calibration
from parplan.solver.cluster import gpu_preset
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.op_layout import Mesh, OpStrategy
from parplan.solver.cost.precision import get_precision
from parplan.solver.cost.rules import op_seconds
from parplan.solver.ir import Graph, make_node


@pytest.mark.parametrize("gpu", ["H100-80GB", "A100-80GB"])
def test_pricing_the_timed_matmul_with_its_calibration_gives_back_its_time(gpu: str) -> None:
    spec, n = gpu_preset(gpu), CUDA_MATMUL_N
    measured_seconds = 2 * n**3 / 600e12 if gpu.startswith("H") else 2 * n**3 / 230e12
    flops = {"bf16": 2 * n**3 / measured_seconds, "fp8": 1e15}
    ceilings = matmul_ceilings(flops, spec, n)
    assert set(ceilings) == ({"bf16", "fp8"} if "fp8" in spec.peak_flops else {"bf16"})
    assert ceilings["bf16"] > flops["bf16"] / spec.peak("bf16")  # the 4096-cubed matmul loses to its tiles and K fill
    g = Graph.of("mm", [make_node("x", "input", dims={"m": n, "k": n}, dtype="bf16"),
                        make_node("w", "parameter", dims={"k": n, "n": n}),
                        make_node("y", "einsum", ["x", "w"], {"m": n, "n": n}, equation="m k, k n -> m n")])
    cal = Calibration(matmul_efficiency=ceilings, source=f"agent:{gpu}@2026-11-25")
    fwd = op_seconds(g.node("y"), g, spec, cal, get_precision("bf16"), OpStrategy((None,)), Mesh((("d", 1),)),
                     Recompute.NONE, True)[0]
    assert fwd == pytest.approx(measured_seconds, rel=1e-9)

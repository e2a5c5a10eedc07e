"""FP8 training (Megatron-LM with Transformer Engine): the FP8 weight copies in memory, the GPU's
dense FP8 rate for the matmuls with a weight, everything else as in bf16."""

from __future__ import annotations

import json
from typing import Any

import pytest

from parplan.cli import main
from parplan.solver.calibration import DEFAULT_CALIBRATION
from parplan.solver.cluster import gpu_preset, make_cluster
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.kernels import KERNELS, GemmShape, shape_factor
from parplan.solver.cost.op_layout import Mesh, OpStrategy
from parplan.solver.cost.precision import get_precision
from parplan.solver.cost.rules import compute_dtype, op_seconds, parameter_states
from parplan.solver.cost.runtime import Runtime
from parplan.solver.evaluate import evaluate_graph
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.presets import get_preset
from parplan.solver.ir import Graph, OpKind, make_node
from parplan.solver.result import Evaluation
from parplan.solver.strategy import ParallelConfig

H100 = gpu_preset("H100-80GB")


def test_h100_dense_fp8_peak_is_the_datasheet_figure() -> None:
    """NVIDIA H100 SXM datasheet: 1,979 TFLOPS FP8 and 989 TFLOPS BF16 dense (half the figures
    printed with sparsity)."""
    assert round(H100.peak("fp8") / 1e12) == 1979
    assert round(H100.peak("bf16") / 1e12) == 989


@pytest.mark.parametrize(("zero", "n", "per_param"), [(0, 8, 20), (1, 8, 4 + 4 + 12 / 8), (3, 8, 20 / 8)])
def test_model_states_add_two_bytes_of_fp8_copies(zero: int, n: int, per_param: float) -> None:
    """bf16 weight + FP8 row-wise and column-wise copies (4), fp32 gradient (4), fp32 master weight
    and Adam moments (12): 20 bytes per parameter, ZeRO sharding as for bf16's 18."""
    held, _ = parameter_states(1000.0, get_precision("fp8"), zero, n, n)
    assert held.parameters + held.gradients + held.optimizer_states == pytest.approx(1000 * per_param)


def test_which_operators_run_in_fp8() -> None:
    """The linear layers of a block; not the LM head over the vocabulary, the attention core, norms."""
    g = build_graph(get_preset("llama-2-7b").with_(layers=1), seq_len=64)
    fp8 = get_precision("fp8")
    in_fp8 = {n.id for n in g.nodes if compute_dtype(n, fp8, g) == "fp8"}
    assert in_fp8 == {f"layers.0.{m}" for m in ("attn.q", "attn.k", "attn.v", "attn.o", "mlp.gate", "mlp.up",
                                               "mlp.down")}
    assert compute_dtype(g.node("head.lm"), fp8, g) == "bf16"
    assert all(compute_dtype(n, get_precision("bf16"), g) == "bf16" for n in g.nodes if n.kind is OpKind.EINSUM)


def _matmul(m: int, k: int, n: int) -> Graph:
    return Graph.of("mm", [make_node("x", "input", dims={"m": m, "k": k}, dtype="bf16"),
                           make_node("w", "parameter", dims={"k": k, "n": n}),
                           make_node("y", "einsum", ["x", "w"], {"m": m, "n": n}, equation="m k, k n -> m n")])


def _passes(g: Graph, node: str, gpu: Any, precision: str, runtime: Runtime = Runtime.MEGATRON) -> tuple[float, float]:
    f, b, _ = op_seconds(g.node(node), g, gpu, DEFAULT_CALIBRATION, get_precision(precision), OpStrategy((None,)),
                         Mesh((("d", 1),)), Recompute.NONE, True, runtime)
    return f, b


def test_a_compute_bound_matmul_runs_at_the_fp8_peak_after_its_cast() -> None:
    """Forward time of a large weight matmul is its FLOPs at each dtype's peak times that dtype's GEMM
    ceiling and the shape's tile and wave factor (parplan.solver.cost.kernels); in FP8 plus the cast
    of its bf16 input, a kernel of its own: on an H100 4 bytes an element (the bf16 read, the FP8
    write and its transposed copy) at the calibration's fraction of the HBM peak."""
    m = k = n = 8192
    g = _matmul(m, k, n)
    factor = shape_factor(GemmShape(1, m, n, k), KERNELS["H100"].sms)
    gemm = {dt: 2 * m * k * n / (H100.peak(dt) * KERNELS["H100"].gemm[dt] * factor) for dt in ("bf16", "fp8")}
    cast = m * k * 4 / (H100.hbm_bandwidth_bytes_per_s * DEFAULT_CALIBRATION.memory_efficiency)
    assert _passes(g, "y", H100, "bf16")[0] == pytest.approx(gemm["bf16"])
    assert _passes(g, "y", H100, "fp8")[0] == pytest.approx(gemm["fp8"] + cast)
    assert _passes(g, "y", H100, "fp8")[0] < _passes(g, "y", H100, "bf16")[0]


def test_fp8_casts_move_the_activation_before_and_the_output_gradient_after() -> None:
    """Each FP8 GEMM pays its casts apart from its arithmetic: forward its bf16 input's, backward its
    output gradient's, at 3 bytes an element on Blackwell (no transposed copies) and 4 on Hopper;
    under Megatron-LM a fused group (q, k, v) casts its one input once, shared by its members, where
    PyTorch's runtime casts it for each. bf16 pays none."""
    b200 = gpu_preset("B200-180GB")
    g = _matmul(4096, 2048, 1024)
    for gpu, per_elem in ((H100, 4), (b200, 3)):
        bw = gpu.hbm_bandwidth_bytes_per_s * DEFAULT_CALIBRATION.memory_efficiency
        (f16, b16), (f8, b8) = _passes(g, "y", gpu, "bf16"), _passes(g, "y", gpu, "fp8")
        gemm_f = f8 - 4096 * 2048 * per_elem / bw
        gemm_b = b8 - 4096 * 1024 * per_elem / bw
        # what is left is the GEMM at the FP8 peak: the bf16 GEMM's time times the rate ratio
        ratio = (gpu.peak("bf16") * KERNELS[gpu.name.split("-")[0]].gemm["bf16"]) / (
            gpu.peak("fp8") * KERNELS[gpu.name.split("-")[0]].gemm["fp8"])
        assert gemm_f == pytest.approx(f16 * ratio)
        assert gemm_b == pytest.approx(b16 * ratio)
    layer = build_graph(get_preset("llama-3-8b").with_(layers=1), seq_len=2048)
    cast = 2048 * 4096 * 3 / (b200.hbm_bandwidth_bytes_per_s * DEFAULT_CALIBRATION.memory_efficiency)
    ratio = (b200.peak("bf16") * KERNELS["B200"].gemm["bf16"]) / (b200.peak("fp8") * KERNELS["B200"].gemm["fp8"])
    for p in "qkv":
        node = f"layers.0.attn.{p}"
        for runtime, share in ((Runtime.MEGATRON, 1 / 3), (Runtime.TORCH, 1.0)):
            bf16 = _passes(layer, node, b200, "bf16", runtime)[0]
            assert _passes(layer, node, b200, "fp8", runtime)[0] == pytest.approx(bf16 * ratio + cast * share)


def test_fp8_plan_memory_and_time_against_bf16() -> None:
    """The same plan in FP8: weights twice bf16's, gradients and optimizer states unchanged, a shorter
    step, and the FP8 GEMMs' saved inputs in FP8 (below)."""
    graph = build_graph(get_preset("llama-2-7b").with_(layers=4), seq_len=1024)
    cluster = make_cluster(8, 8, "H100-80GB")

    def run(precision: str) -> Evaluation:
        cfg = ParallelConfig(tp=2, pp=1, dp=4, micro_batch=1, num_microbatches=2, precision=precision)
        return evaluate_graph(graph, "m", graph.parameter_count(), cluster, cfg)

    bf16, fp8 = run("bf16"), run("fp8")
    b, f = bf16.memory.peak_stage.memory.bytes, fp8.memory.peak_stage.memory.bytes
    assert f.parameters == pytest.approx(2 * b.parameters)
    assert (f.gradients, f.optimizer_states) == (b.gradients, b.optimizer_states)
    assert fp8.time.step_seconds < bf16.time.step_seconds


@pytest.mark.parametrize(("runtime", "sp"), [(Runtime.MEGATRON, False), (Runtime.MEGATRON, True),
                                             (Runtime.TORCH, False)])
def test_a_llama_blocks_saved_bytes_under_fp8(runtime: Runtime, sp: bool) -> None:
    """Transformer Engine's FP8 GEMMs save their input cast to FP8 instead of the bf16 input
    (module/layernorm_linear.py and linear.py: ``update_usage(rowwise_usage=False)``, the column-wise
    copy only; with sequence parallelism the row-wise local shard only, Float8 quantizers gather
    row-wise only): 1 byte an element. Per token of one Llama block (hidden h, ffn f), bf16 keeps the
    norms' outputs (2h each: Q/K/V's and gate/up's input), the attention output (2h, which the
    attention keeps too) and the SwiGLU product (2f, the down projection's input); FP8 keeps
    1h + 1h in FP8 for the norms' outputs (TE's LayerNormLinear does not save its bf16 output), the
    attention output in bf16 and again in FP8 (1h more), and 1f for the product. bf16 - FP8 per
    device with TP 2: without sequence parallelism the norms' outputs are whole on each device,
    h + h - h/2 + f/2; with it every term is halved, (h + f) / 2. Another runtime keeps bf16's."""
    h, f, layers, seq = 4096, 11008, 4, 1024
    graph = build_graph(get_preset("llama-2-7b").with_(layers=layers), seq_len=seq)
    cluster = make_cluster(8, 8, "H100-80GB")

    def act(precision: str) -> float:
        cfg = ParallelConfig(tp=2, pp=1, dp=4, micro_batch=1, num_microbatches=2, precision=precision,
                             runtime=runtime, sequence_parallel=sp)
        ev = evaluate_graph(graph, "m", graph.parameter_count(), cluster, cfg)
        return ev.memory.peak_stage.memory.bytes.activations

    per_token = (h + f) / 2 if sp else 2 * h - h / 2 + f / 2
    if runtime is not Runtime.MEGATRON:
        per_token = 0
    assert act("bf16") - act("fp8") == pytest.approx(per_token * seq * layers)
    assert act("fp8-cs") == act("fp8")


def test_fp8_on_a_gpu_without_fp8_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["memory", "--model", "llama-2-7b", "--gpus", "8", "--tp", "2", "--pp", "1", "--gpu", "A100-80GB",
               "--precision", "fp8"])
    err = capsys.readouterr().err
    assert rc == 2 and "has no fp8 peak" in err and len(err.strip().splitlines()) == 1


def test_plan_searches_and_prices_baselines_in_fp8(capsys: pytest.CaptureFixture[str]) -> None:
    """``parplan plan --precision fp8``: the plan says so, and the baselines, priced in FP8 too, hold
    the FP8 copies (more memory) and run their matmuls faster than in bf16."""
    def plan(precision: str) -> dict[str, Any]:
        assert main(["plan", "--model", "gpt-1.7b", "--gpus", "8", "--gpu", "H100-80GB", "--precision", precision,
                     "--search", "dp", "--global-batch", "16", "--json"]) == 0
        return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]

    bf16, fp8 = plan("bf16"), plan("fp8")
    assert (bf16["strategy"]["precision"], fp8["strategy"]["precision"]) == ("bf16", "fp8")
    b, f = bf16["baselines"]["zero3"], fp8["baselines"]["zero3"]
    assert f["strategy"] == {**b["strategy"], "precision": "fp8"}
    assert f["memory"]["breakdown"]["parameters"] > b["memory"]["breakdown"]["parameters"]
    assert f["time"]["step_seconds"] < b["time"]["step_seconds"]


def test_current_scaling_reads_each_cast_tensor_once_more_and_keeps_the_same_bytes() -> None:
    """``fp8-cs`` (current scaling: the amax of each tensor before it is cast) prices each cast at 2
    bytes an element more than ``fp8`` (delayed scaling), forward and backward; memory is the same."""
    g = _matmul(4096, 2048, 1024)
    bw = H100.hbm_bandwidth_bytes_per_s * DEFAULT_CALIBRATION.memory_efficiency
    (f, b), (fcs, bcs) = _passes(g, "y", H100, "fp8"), _passes(g, "y", H100, "fp8-cs")
    assert fcs - f == pytest.approx(4096 * 2048 * 2 / bw)
    assert bcs - b == pytest.approx(4096 * 1024 * 2 / bw)
    delayed, current = get_precision("fp8"), get_precision("fp8-cs")
    assert (current.param_bytes, current.grad_bytes, current.optimizer_state_bytes, current.activation_bytes) == (
        delayed.param_bytes, delayed.grad_bytes, delayed.optimizer_state_bytes, delayed.activation_bytes)
    assert current.matmul_dtype == "fp8" and current.fp8_current_scaling and not delayed.fp8_current_scaling

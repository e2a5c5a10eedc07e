"""torchao's Float8 training as torchtitan runs it (``fp8-torchao``, ``fp8-torchao-fsdp8``): closed forms
derived from torchao's code, not from parplan's.

torchao/float8/float8_linear.py, ``matmul_with_hp_or_float8_args.forward``: ``ctx.save_for_backward(input_hp,
weight_hp_t)`` (the high-precision input and weight; the float8 casts are locals freed on return), and no
module keeps a float8 copy of its weight between calls: the saved activations and the resident states are
bf16 training's. torchao/float8/fsdp_utils.py, ``WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather``:
returns ``(float8_training_tensor._data,)`` (one byte an element) and the scale as metadata, so FSDP2's
unsharded copy of a Float8 linear layer's weight is one byte an element instead of bf16's two; norms,
the embedding and the output layer (filtered) stay bf16. torchtitan/components/quantization/utils.py,
``module_filter_fn``: only linear layers whose in- and out-features are multiples of 16 are converted.
"""

from __future__ import annotations

import pytest

from parplan.cli import main
from parplan.solver.cluster import gpu_preset, make_cluster
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.precision import get_precision
from parplan.solver.cost.rules import _torchao_cast_seconds
from parplan.solver.cost.runtime import Runtime
from parplan.solver.cost.unit_strategy import UnitStrategy
from parplan.solver.cost.units import GraphCosts
from parplan.solver.errors import StrategyError
from parplan.solver.evaluate import evaluate_graph
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.ir import Graph, make_node
from parplan.solver.models import ModelSource
from parplan.solver.strategy import ParallelConfig

H, F, V, L, N = 1024, 4096, 2048, 2, 8  # hidden, ffn, vocab, layers, GPUs (FSDP over all of them)
BLOCK_LINEAR = 4 * H * H + 3 * H * F  # q, k, v, o (8 heads of 128, 8 KV heads) and gate, up, down
BLOCK_NORMS = 2 * H


def _graph(hidden: int = H) -> Graph:
    cfg = TransformerConfig(family="llama", name="small", layers=L, hidden=hidden, heads=8, ffn=F, vocab=V,
                            seq_len=256, kv_heads=8)
    return ModelSource("small", config=cfg).build(1, 256)


def _memory(g: Graph, precision: str):  # type: ignore[no-untyped-def]
    s = ParallelConfig(dp=N, zero=3, micro_batch=1, runtime=Runtime.TORCHTITAN, precision=precision,
                       recompute=Recompute.NONE)
    return evaluate_graph(g, "small", g.parameter_count(), make_cluster(N, N, "H100-80GB"), s).memory.stages[0]


def test_converted_weights_are_the_block_linears_with_features_multiple_of_16() -> None:
    g = _graph()
    assert GraphCosts(g).float8_params == {f"layers.{i}.{m}.weight" for i in range(L)
                                           for m in ("attn.q", "attn.k", "attn.v", "attn.o", "mlp.gate", "mlp.up",
                                                     "mlp.down")}
    # hidden 1000: no linear layer of a block has both its features multiples of 16 but none
    assert GraphCosts(_graph(1000)).float8_params == set()


def test_states_and_activations_are_bf16s_and_fsdp8_gathers_one_byte() -> None:
    g = _graph()
    bf16, tensorwise, fsdp8 = (_memory(g, p) for p in ("bf16", "fp8-torchao", "fp8-torchao-fsdp8"))
    params = g.parameter_count()
    # torchtitan: fp32 sharded weights (the master), fp32 gradients, Adam's two fp32 moments: 16 B / N
    for st in (tensorwise, fsdp8):
        b = st.memory.bytes
        assert b.parameters + b.gradients + b.optimizer_states == pytest.approx(16 * params / N)
        assert st.activation_bytes_per_microbatch == bf16.activation_bytes_per_microbatch  # input_hp saved
    assert tensorwise.memory.bytes.temporary == bf16.memory.bytes.temporary  # gathered in bf16, no copies
    # a block's gathered copy: BLOCK_LINEAR x 1 + BLOCK_NORMS x 2 instead of (BLOCK_LINEAR + BLOCK_NORMS) x 2
    saved = bf16.memory.bytes.temporary - fsdp8.memory.bytes.temporary
    assert saved in (BLOCK_LINEAR, 2 * BLOCK_LINEAR)  # the peak holds one gathered block, or two (prefetch)
    gc = GraphCosts(g)
    unit = "layers.0"
    us = UnitStrategy(recompute=Recompute.NONE, runtime=Runtime.TORCHTITAN)
    fsdp8, tensorwise_cost = (gc.unit_cost(unit, us, get_precision(p)) for p in ("fp8-torchao-fsdp8", "fp8-torchao"))
    assert fsdp8.param_gathered_bytes == BLOCK_LINEAR + 2 * BLOCK_NORMS
    assert tensorwise_cost.param_gathered_bytes == 2 * (BLOCK_LINEAR + BLOCK_NORMS)


def test_fsdp8_sends_half_and_casts_no_weight() -> None:
    g = _graph()
    cl = make_cluster(N, N, "H100-80GB")
    t = {p: evaluate_graph(g, "small", g.parameter_count(), cl, ParallelConfig(
        dp=N, zero=3, micro_batch=1, runtime=Runtime.TORCHTITAN, precision=p)).time.step_seconds
         for p in ("fp8-torchao", "fp8-torchao-fsdp8")}
    assert t["fp8-torchao-fsdp8"] < t["fp8-torchao"]
    assert get_precision("fp8-torchao-fsdp8").transfer_bytes(True) == 1
    assert get_precision("fp8-torchao-fsdp8").transfer_bytes(False) == 2


@pytest.mark.parametrize("gathered_fp8", [False, True])
def test_torchao_casts_of_one_linear(gathered_fp8: bool) -> None:
    """float8_linear.py: forward casts input and weight (hp_tensor_to_float8_dynamic, each reading the
    tensor for its amax, then reading it and writing one byte: 2 + 2 + 1 bytes an element); backward
    casts grad_output twice (dim0 for grad_input, dim1 for grad_weight), the weight and the saved input
    again. A weight already in float8 (FSDP2's float8 all-gather) is not cast."""
    m, k, n = 4096, 1024, 2048
    g = Graph.of("mm", [make_node("x", "input", dims={"m": m, "k": k}, dtype="bf16"),
                        make_node("w", "parameter", dims={"k": k, "n": n}),
                        make_node("y", "einsum", ["x", "w"], {"m": m, "n": n}, equation="m k, k n -> m n")])
    gpu = gpu_preset("H100-80GB")
    bw = gpu.hbm_bandwidth_bytes_per_s
    w = 0 if gathered_fp8 else k * n
    fwd, bwd = _torchao_cast_seconds(g.node("y"), g, gpu, [1, 1], 1, 1.0, gathered_fp8)
    assert fwd == pytest.approx((m * k + w) * 5 / bw)
    assert bwd == pytest.approx((2 * m * n + w + m * k) * 5 / bw)


@pytest.mark.parametrize("runtime", [Runtime.MEGATRON, Runtime.TORCH, Runtime.DEEPSPEED])
def test_other_runtimes_refuse_torchao_float8(runtime: Runtime) -> None:
    with pytest.raises(StrategyError, match="torchao's Float8 as torchtitan runs it"):
        ParallelConfig(dp=N, runtime=runtime, precision="fp8-torchao")


def test_a_plan_request_needs_the_torchtitan_target(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "--model", "llama-3-8b", "--gpus", "8", "--gpu", "H100-80GB", "--precision", "fp8-torchao"]
    assert main([*args, "--target", "megatron"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "target torchtitan" in err and "Traceback" not in err

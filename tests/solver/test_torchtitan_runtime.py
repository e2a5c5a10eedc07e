"""The ``torchtitan`` runtime's rules, each against a closed form (the measurement behind them is
``tests/agent/test_torchtitan_run.py``): fp32 weights as the master copy (16 bytes a parameter with
Adam in bf16), gradients made in backward (the peak of a step of one micro-batch is below the
resident states plus the activations by at most the gradients, and the optimizer step holds them
all), and the CPU RMSNorm's fp32 copies."""

from __future__ import annotations

import pytest

from parplan.solver.cost.activations import Recompute, op_saved_items
from parplan.solver.cost.plan_memory import plan_memory
from parplan.solver.cost.precision import get_precision
from parplan.solver.cost.runtime import Runtime
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.ir import OpKind
from parplan.solver.strategy import ParallelConfig

LLAMA = TransformerConfig(family="llama", name="tiny-llama", layers=4, hidden=256, heads=8, kv_heads=8, ffn=768,
                          vocab=1024, seq_len=128, tied_embeddings=False)


def _params() -> int:
    return build_graph(LLAMA, batch=1).parameter_count()


@pytest.mark.parametrize(("zero", "dp"), [(0, 1), (0, 4), (2, 4), (3, 4)])
def test_bf16_model_states_are_16_bytes_a_parameter(zero: int, dp: int) -> None:
    p = _params()
    st = plan_memory(build_graph(LLAMA, batch=1), ParallelConfig(dp=dp, zero=zero, precision="bf16",
                                                                 runtime=Runtime.TORCHTITAN)).stages[0].memory.bytes
    shard = dp if zero else 1
    assert st.parameters == pytest.approx(4 * p / (dp if zero >= 2 else 1))  # fp32, sharded by FSDP2
    assert st.gradients == pytest.approx(4 * p / (dp if zero >= 2 else 1))
    assert st.optimizer_states == pytest.approx(8 * p / shard)
    torch = plan_memory(build_graph(LLAMA, batch=1), ParallelConfig(dp=dp, zero=zero, precision="bf16",
                                                                    runtime=Runtime.TORCH)).stages[0].memory.bytes
    assert torch.model_states - st.model_states == pytest.approx(2 * p / (dp if zero >= 2 else 1))


def test_fp32_states_are_the_same_as_the_torch_runtime() -> None:
    graph = build_graph(LLAMA, batch=1)
    a, b = (plan_memory(graph, ParallelConfig(dp=2, zero=3, precision="fp32", runtime=r)).stages[0].memory.bytes
            for r in (Runtime.TORCH, Runtime.TORCHTITAN))
    assert a.model_states == pytest.approx(b.model_states)


@pytest.mark.parametrize("zero", [0, 2, 3])
@pytest.mark.parametrize("batch", [1, 4])
def test_gradients_are_not_held_before_backward(zero: int, batch: int) -> None:
    """One micro-batch: the start of backward holds the states but the gradients, and every
    activation; the optimizer step every state. The torch runtime (same buffers otherwise) holds the
    gradients from the start, so its peak is at least as high."""
    graph = build_graph(LLAMA, batch=batch)
    cfg = {"dp": 4, "zero": zero, "precision": "bf16", "recompute": Recompute.SELECTIVE}
    titan = plan_memory(graph, ParallelConfig(**cfg, runtime=Runtime.TORCHTITAN)).stages[0]  # type: ignore[arg-type]
    m = titan.memory.bytes
    assert titan.peak_bytes >= (m.model_states - m.gradients + m.activations) * (1 - 1e-9)
    assert titan.peak_bytes >= m.model_states
    # the same states priced with gradients held between steps
    kept = plan_memory(graph, ParallelConfig(**cfg, runtime=Runtime.TORCH)).stages[0]  # type: ignore[arg-type]
    p = _params()
    master = 2 * p / (4 if zero >= 2 else 1)  # the torch runtime's bf16 copy beside the fp32 master
    assert titan.peak_bytes <= kept.peak_bytes - master + 1e-6


def test_cpu_rmsnorm_keeps_fp32_copies_in_bf16() -> None:
    graph = build_graph(LLAMA, batch=2)
    norm = next(n for n in graph.nodes if n.kind is OpKind.RMSNORM)
    items = op_saved_items(norm, graph, get_precision("bf16").activation_bytes, flash_attention=True,
                           recompute=Recompute.SELECTIVE, runtime=Runtime.TORCHTITAN_CPU)
    assert [i.elem_bytes for i in items] == [4.0, 4.0]
    assert items[0].key != norm.inputs[0]  # an fp32 copy, not the bf16 input itself
    fp32 = op_saved_items(norm, graph, 4, flash_attention=True, recompute=Recompute.SELECTIVE,
                          runtime=Runtime.TORCHTITAN_CPU)
    assert fp32[0].key == norm.inputs[0]  # in fp32 the input itself
    gpu = op_saved_items(norm, graph, 2, flash_attention=True, recompute=Recompute.SELECTIVE,
                         runtime=Runtime.TORCHTITAN)
    assert [i.elem_bytes for i in gpu] == [2]

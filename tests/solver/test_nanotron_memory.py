"""The runtime ``nanotron`` against closed forms read from nanotron's code, on a small Llama.

The model: 2 layers, hidden 256, 4 heads, ffn 512, vocabulary 1,024, untied, sequence 128. Its
parameters by hand: embedding and LM head 1,024 x 256 each; per layer q, k, v, o 4 x 256² and the
SwiGLU MLP 3 x 256 x 512, two RMSNorms 2 x 256; the final norm 256:
Ψ = 2 x 262,144 + 2 x (262,144 + 393,216 + 512) + 256 = 1,836,288.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from parplan.solver.cost.nanotron import nanotron_partition, partition_of
from parplan.solver.cost.plan_memory import plan_memory
from parplan.solver.cost.runtime import CUBLAS_WORKSPACE_BYTES, Runtime
from parplan.solver.errors import StrategyError
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.models import ModelSource
from parplan.solver.strategy import ParallelConfig, Recompute

CONFIG = TransformerConfig(family="llama", name="tiny-nanotron", layers=2, hidden=256, heads=4, ffn=512, vocab=1024,
                           seq_len=128, tied_embeddings=False)
PSI = 2 * 1024 * 256 + 2 * (4 * 256**2 + 3 * 256 * 512 + 2 * 256) + 256


def _stage0(dp: int, zero: int, runtime: Runtime = Runtime.NANOTRON, micro_batch: int = 1):
    graph = ModelSource("tiny", config=CONFIG).build(micro_batch, CONFIG.seq_len)
    assert graph.parameter_count() == PSI == 1_836_288
    cfg = ParallelConfig(dp=dp, zero=zero, recompute=Recompute.NONE, micro_batch=micro_batch, runtime=runtime)
    return plan_memory(graph, cfg).stages[0]


@pytest.mark.parametrize(("dp", "zero", "per_param"), [
    # (weight, gradients, optimizer) bytes per parameter, from nanotron's code:
    # dp 1: bf16 weight; FP32GradientAccumulator's fp32 grad buffer; fp32 master + Adam's two fp32 moments
    (1, 0, (2, 4, 12)),
    # DDP (no gradient_as_bucket_view): its buckets, a bf16 copy of every gradient, besides the fp32 buffer
    (4, 0, (2, 6, 12)),
    # ZeRO-1: master and moments over the 4 ranks; the fp32 buffer stays whole ("keep grad buffers for all
    # parameters even when Zero 1 is used")
    (4, 1, (2, 6, 3)),
])
def test_model_states_per_parameter(dp: int, zero: int, per_param: tuple[int, int, int]) -> None:
    b = _stage0(dp, zero).memory.bytes
    assert (b.parameters, b.gradients, b.optimizer_states) == tuple(PSI * k for k in per_param)


def test_each_micro_batch_makes_its_bf16_gradients_beside_the_fp32_buffer() -> None:
    # FP32GradientAccumulator.backward: loss.backward() makes every param.grad (bf16), then adds them into
    # the fp32 buffer and sets them to None; at the end of each backward all 2Ψ bytes are alive, besides
    # the resident states and cuBLAS's two workspaces (PyTorch's matmuls, held from the first use)
    nano, mega = _stage0(1, 0), _stage0(1, 0, Runtime.MEGATRON)
    resident = 18 * PSI
    assert nano.memory.bytes.model_states == mega.memory.bytes.model_states == resident
    assert nano.peak_bytes >= resident + 2 * PSI + 2 * CUBLAS_WORKSPACE_BYTES
    # made and freed within each micro-batch: gradients being made, counted among the temporaries
    assert nano.memory.bytes.temporary >= 2 * PSI + 2 * CUBLAS_WORKSPACE_BYTES
    # and nothing else differs from Megatron-LM's buffers: the rule adds at most those gradients
    assert nano.peak_bytes <= mega.peak_bytes + 2 * PSI + 2 * CUBLAS_WORKSPACE_BYTES


@pytest.mark.parametrize("dp", [1, 4])
def test_cpu_variant_has_no_cublas_workspaces_and_cpu_rmsnorm(dp: int) -> None:
    # nanotron-cpu: the same model states; no CUDA library holds a workspace; each of the 5 RMSNorms (2 a
    # layer, the final one) is PyTorch's CPU composite, which keeps its input upcast to fp32 and the fp32
    # normalised input (4 + 4 bytes an element) where nanotron's fused kernel keeps its bf16 input (2)
    gpu, cpu = _stage0(dp, 0), _stage0(dp, 0, Runtime.NANOTRON_CPU)
    assert cpu.memory.bytes.model_states == gpu.memory.bytes.model_states
    assert gpu.memory.bytes.temporary - cpu.memory.bytes.temporary == 2 * CUBLAS_WORKSPACE_BYTES
    assert cpu.memory.bytes.activations - gpu.memory.bytes.activations == 5 * CONFIG.seq_len * 256 * (4 + 4 - 2)


def test_gradients_made_anew_do_not_accumulate_over_micro_batches() -> None:
    # the accumulator frees them after every micro-batch: 8 micro-batches hold what one does
    graph = ModelSource("tiny", config=CONFIG).build(1, CONFIG.seq_len)
    one = ParallelConfig(dp=1, recompute=Recompute.NONE, runtime=Runtime.NANOTRON)
    eight = replace(one, num_microbatches=8)
    assert plan_memory(graph, eight).peak_bytes == plan_memory(graph, one).peak_bytes


def test_layer_split_by_nanotrons_cost_model() -> None:
    # LlamaModel.get_block_compute_costs: a layer 4·heads·head_dim·h + 3·ffn·h, the LM head vocab·h;
    # build_model moves to the next rank once the running cost passes total·(rank + 1)/pp.
    # 4 layers, h 64, 4 heads, ffn 256, vocab 64: layer 16,384 + 49,152 = 65,536, head 4,096, total
    # 266,240; rank 0's threshold 133,120 is passed by the third layer (196,608): (3, 1)
    assert nanotron_partition(4, 64, 4, 256, 64, 2) == (3, 1)
    # the playbook's 1B (16 layers, h 2048, 32 heads, ffn 8192, vocab 131,072) on 4 ranks: layer
    # 67,108,864, head 268,435,456, thresholds 335.5M x (1, 2, 3, 4); the sixth layer reaches exactly
    # the first (not past it), the last layer passes the third: the LM head alone on rank 3
    assert nanotron_partition(16, 2048, 32, 8192, 131_072, 4) == (6, 5, 5, 0)
    with pytest.raises(StrategyError, match="without a decoder layer"):
        partition_of(replace(CONFIG, layers=16, hidden=2048, heads=32, ffn=8192, vocab=131_072), 4)
    assert partition_of(CONFIG, 1) is None

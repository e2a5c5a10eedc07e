"""Transformer Engine FusedAdam's low-precision states (``*-remainders``, ``*-moments-bf16``): closed forms
from Transformer Engine's code, not from parplan's.

``transformer_engine/pytorch/optimizers/fused_adam.py``, ``_initialize_state``: with ``master_weights`` and
``store_param_remainders`` (bf16 weights, fp32 master) the master is ``torch.zeros_like(param,
dtype=torch.int16)``; ``exp_avg`` and ``exp_avg_sq`` are ``torch.empty_like(param, dtype=exp_avg_dtype)``
(fp32 by default, bf16 when asked). The bytes per element are read from torch's own dtypes. The weights
(bf16) and the gradients (fp32 accumulation under Megatron-LM's ``--bf16``) are not the optimizer's.
"""

from __future__ import annotations

import pytest
import torch

from parplan.cli import main
from parplan.solver.cluster import make_cluster
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.precision import PRECISIONS, get_precision, te_fused_adam
from parplan.solver.cost.rules import optimizer_temporary_bytes
from parplan.solver.cost.runtime import Runtime
from parplan.solver.errors import ConfigError, StrategyError
from parplan.solver.evaluate import evaluate_graph
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.ir import Graph
from parplan.solver.models import ModelSource
from parplan.solver.strategy import ParallelConfig

H, F, V, L, N = 1024, 4096, 2048, 2, 8  # hidden, ffn, vocab, layers, GPUs (data parallel over all of them)


def _size(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def _te_states_bytes(remainders: bool, exp_avg: torch.dtype) -> int:
    """Bytes per parameter FusedAdam(master_weights=True) allocates for a bf16 weight: its master (int16
    remainders, or an fp32 copy) and its two moments."""
    master = torch.int16 if remainders else torch.float32
    return _size(master) + 2 * _size(exp_avg)


def _graph() -> Graph:
    cfg = TransformerConfig(family="llama", name="small", layers=L, hidden=H, heads=8, ffn=F, vocab=V,
                            seq_len=256, kv_heads=8)
    return ModelSource("small", config=cfg).build(1, 256)


CASES = [("bf16-remainders", True, torch.float32), ("bf16-moments-bf16", False, torch.bfloat16),
         ("bf16-remainders-moments-bf16", True, torch.bfloat16)]


@pytest.mark.parametrize(("name", "remainders", "exp_avg"), CASES)
def test_megatron_distributed_optimizer_shards_fused_adams_states(name: str, remainders: bool,
                                                                  exp_avg: torch.dtype) -> None:
    """Megatron-LM's distributed optimizer (ZeRO-1) hands FusedAdam each rank's shard of the bf16 weights:
    its states are params / dp x the bytes above; the weights and the fp32 gradients stay whole."""
    g = _graph()
    params = g.parameter_count()
    s = ParallelConfig(dp=N, zero=1, micro_batch=1, runtime=Runtime.MEGATRON, precision=name,
                       recompute=Recompute.NONE)
    b = evaluate_graph(g, "small", params, make_cluster(N, N, "H100-80GB"), s).memory.stages[0].memory.bytes
    assert b.optimizer_states == pytest.approx(params / N * _te_states_bytes(remainders, exp_avg))
    assert b.parameters == pytest.approx(params * _size(torch.bfloat16))
    assert b.gradients == pytest.approx(params * _size(torch.float32))


def test_fsdp2_shards_weights_gradients_and_states_over_tp_pp_and_dp() -> None:
    """NeMo Automodel's FSDP2 with TE's FusedAdam (runtime torch, ZeRO-3): every model state is sharded, the
    weight over tp x pp x dp: params / (tp pp dp) x (2 weight + 4 fp32 gradient + 2 remainder + 4 + 4)."""
    g = _graph()
    params = g.parameter_count()
    s = ParallelConfig(tp=2, pp=1, dp=4, zero=3, micro_batch=1, runtime=Runtime.TORCH, precision="bf16-remainders",
                       recompute=Recompute.FULL)
    e = evaluate_graph(g, "small", params, make_cluster(N, N, "H100-80GB"), s)
    b = e.memory.stages[0].memory.bytes
    per_param = _size(torch.bfloat16) + _size(torch.float32) + _te_states_bytes(True, torch.float32)
    assert b.parameters + b.gradients + b.optimizer_states == pytest.approx(params / N * per_param, rel=0.02)
    assert b.optimizer_states == pytest.approx(params / N * _te_states_bytes(True, torch.float32), rel=0.02)


def test_remainders_are_stored_for_bf16_weights_with_an_fp32_master_only() -> None:
    """FusedAdam: ``store_param_remainders and master_weights and master_weight_dtype == torch.float32``, for
    ``p.dtype == torch.bfloat16`` weights; fp16 and fp32 weights, and weights held as FP8 only, have none."""
    for base in ("fp16", "fp32", "fp8-pg", "fp8-torchao", "bf16-states16"):
        with pytest.raises(ConfigError, match="FusedAdam"):
            te_fused_adam(get_precision(base), True, False)
    with pytest.raises(ConfigError, match="unknown precision"):
        get_precision("fp16-remainders")
    assert {n for n, p in PRECISIONS.items() if p.te_adam} >= {"bf16-grad16-remainders", "fp8-remainders-moments-bf16"}


def test_the_update_still_computes_in_fp32() -> None:
    """The kernels rebuild the fp32 master from the weight and its remainder: Adam's temporaries are bf16's."""
    base = optimizer_temporary_bytes(1e6, get_precision("bf16"))
    assert all(optimizer_temporary_bytes(1e6, get_precision(n)) == base for n, _, _ in CASES)


@pytest.mark.parametrize("runtime", [Runtime.TORCHTITAN, Runtime.DEEPSPEED, Runtime.NANOTRON, Runtime.TORCH_CPU])
def test_runtimes_without_te_fused_adam_refuse_its_states(runtime: Runtime) -> None:
    with pytest.raises(StrategyError, match="FusedAdam"):
        ParallelConfig(dp=N, zero=1, runtime=runtime, precision="bf16-remainders")


def test_megatron_optimizer_offload_keeps_fp32_states() -> None:
    """megatron-core's HybridDeviceOptimizer keeps the fp32 master itself (``param_update_in_fp32``)."""
    with pytest.raises(StrategyError, match="hybrid CPU/GPU optimizer"):
        ParallelConfig(dp=N, zero=1, runtime=Runtime.MEGATRON, precision="bf16-remainders", optimizer_offload=0.5)


def test_cli_memory_prices_the_remainders_and_refuses_another_runtime(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["memory", "--model", "gpt-1.7b", "--gpus", "8", "--tp", "2", "--pp", "1", "--zero", "1",
            "--gpu", "H100-80GB"]
    assert main([*args, "--precision", "bf16-remainders", "--runtime", "torchtitan"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "FusedAdam" in err and "Traceback" not in err
    assert main([*args, "--precision", "bf16-remainders"]) == 0

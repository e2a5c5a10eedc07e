"""Megatron-LM's ``--fp8-param-gather`` (``fp8-pg*``): closed forms from Megatron-LM's and Transformer
Engine's code, not from parplan's.

megatron/core/fp8_utils.py and transformer_engine's ``fp8_model_init``: the linear layers' weights are
created as Float8Tensors, with no bf16 copy; megatron/core/distributed/param_and_grad_buffer.py makes
their buffer ``torch.uint8`` (one byte an element, what the distributed optimizer's all-gather sends);
after each gather TE builds the transpose Hopper's backward GEMM reads (one more byte). The embedding,
the output layer and the norms stay bf16 (two bytes). Without the flag, TE keeps the bf16 weight and caches
its row-wise and column-wise FP8 copies (2 + 2 bytes). The fp32 master weights and Adam's moments are the
distributed optimizer's, sharded over the data-parallel ranks, either way.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from parplan.cli import main
from parplan.solver.cluster import make_cluster
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.precision import get_precision
from parplan.solver.cost.runtime import Runtime
from parplan.solver.errors import StrategyError
from parplan.solver.evaluate import evaluate_graph
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.ir import Graph
from parplan.solver.models import ModelSource
from parplan.solver.strategy import ParallelConfig

H, F, V, L, N = 1024, 4096, 2048, 2, 8  # hidden, ffn, vocab, layers, GPUs (data parallel over all of them)


def _graph() -> Graph:
    cfg = TransformerConfig(family="llama", name="small", layers=L, hidden=H, heads=8, ffn=F, vocab=V,
                            seq_len=256, kv_heads=8)
    return ModelSource("small", config=cfg).build(1, 256)


def _evaluate(g: Graph, precision: str):  # type: ignore[no-untyped-def]
    s = ParallelConfig(dp=N, zero=1, micro_batch=1, runtime=Runtime.MEGATRON, precision=precision,
                       recompute=Recompute.NONE)
    return evaluate_graph(g, "small", g.parameter_count(), make_cluster(N, N, "H100-80GB"), s)


def test_fp8_weights_only_hold_two_bytes_a_parameter() -> None:
    g = _graph()
    params = g.parameter_count()
    for name, weights in (("fp8", 4), ("fp8-grad16", 4), ("fp8-pg", 2), ("fp8-pg-grad16", 2), ("fp8-cs-pg", 2)):
        b = _evaluate(g, name).memory.stages[0].memory.bytes
        grads = 2 if name.endswith("grad16") else 4
        assert b.parameters == pytest.approx(weights * params), name
        assert b.gradients == pytest.approx(grads * params), name
        assert b.optimizer_states == pytest.approx(12 * params / N), name  # fp32 master + 2 moments, sharded


def test_the_gather_sends_one_byte_for_an_fp8_weight() -> None:
    pg, fp8 = get_precision("fp8-pg"), get_precision("fp8")
    assert (pg.transfer_bytes(True), pg.transfer_bytes(False)) == (1, 2)  # uint8 buffer; bf16 embeddings
    assert (fp8.transfer_bytes(True), fp8.transfer_bytes(False)) == (2, 2)  # the bf16 weights gathered
    assert pg.gathered_bytes(True) == 2  # the gathered Float8Tensor and its transpose
    g = _graph()
    assert _evaluate(g, "fp8-pg").time.step_seconds < _evaluate(g, "fp8").time.step_seconds


@pytest.mark.parametrize("runtime", [Runtime.TORCH, Runtime.TORCHTITAN, Runtime.DEEPSPEED])
def test_other_runtimes_refuse_fp8_param_gather(runtime: Runtime) -> None:
    with pytest.raises(StrategyError, match="--fp8-param-gather"):
        ParallelConfig(dp=N, runtime=runtime, precision="fp8-pg")


def test_a_plan_request_needs_the_megatron_target(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "--model", "llama-3-8b", "--gpus", "8", "--gpu", "H100-80GB", "--precision", "fp8-pg"]
    assert main([*args, "--target", "torchtitan"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "target megatron" in err and "Traceback" not in err


def test_the_megatron_export_needs_the_distributed_optimizer(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """megatron/training/arguments.py asserts ``--fp8-param-gather`` with the distributed optimizer
    (or an FSDP): a ZeRO-0 plan is refused, naming why."""
    assert main(["memory", "--model", "gpt-1.7b", "--gpus", "8", "--tp", "2", "--pp", "1", "--zero", "0",
                 "--precision", "fp8-pg", "--gpu", "H100-80GB", "--json"]) == 0
    (tmp_path / "priced.json").write_text(capsys.readouterr().out)
    rc = main(["export", str(tmp_path / "priced.json"), "--target", "megatron", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc != 0 and "--fp8-param-gather needs the distributed optimizer" in err and "Traceback" not in err

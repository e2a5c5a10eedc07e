"""Megatron-LM's fused SwiGLU: what a gated MLP keeps for backward under the megatron runtime.

With ``--swiglu`` Megatron-LM's ``MLP.forward`` runs ``linear_fc1`` (gate and up as one GEMM), then
``bias_swiglu_impl`` (``megatron/core/fusions/fused_bias_swiglu.py``): an autograd function whose
forward saves only its input, fc1's output (``ctx.save_for_backward(input_for_backward)``, 2f a
token), and whose backward computes ``silu`` again from it (``swiglu_back``); ``linear_fc2`` saves its
own input (f). PyTorch's ``silu(gate) * up`` keeps the gate (SiLU's input), the SiLU output and the up
half (the product's inputs) and the product (fc2's input): 4f. Under tensor parallelism every one of
them is split over the ffn dim: f/t.
"""

from __future__ import annotations

import pytest

from parplan.imports.megatron import read_megatron_args
from parplan.solver.cost.activations import Recompute, fused_swiglu_activation, saved_items
from parplan.solver.cost.plan_memory import plan_memory
from parplan.solver.cost.runtime import Runtime
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.frontends.presets import get_preset
from parplan.solver.ir import Graph
from parplan.solver.strategy import ParallelConfig

S, B, H, F = 128, 2, 256, 768
SMALL = get_preset("llama-2-7b").with_(layers=2, hidden=H, heads=8, kv_heads=8, ffn=F, vocab=512, seq_len=S)


def _saved_bytes(graph: Graph, prefix: str, runtime: Runtime, fp8: bool) -> float:
    """Bytes the operators whose ids start with ``prefix`` keep for backward, each buffer once."""
    nodes = [n for n in graph.nodes if n.id.startswith(prefix)]
    items = {it.key: it for it in saved_items(graph, nodes, 2, flash_attention=True, recompute=Recompute.NONE,
                                              runtime=runtime, fp8_inputs=fp8)}
    return sum(it.total_bytes for it in items.values())


@pytest.mark.parametrize("fp8", [False, True])
def test_megatron_keeps_fc1s_output_and_fc2s_input(fp8: bool) -> None:
    """Per token, bf16: fc1's input (the norm's output, h), fc1's output (2f) and fc2's input (f), 2 bytes
    each. Under Transformer Engine's FP8 the GEMMs' inputs are saved in FP8 (1 byte: h and f), fc1's
    output stays bf16 (2 bytes, 2f). nanotron's ``GLUActivation`` and PyTorch's MLPs keep the SiLU
    output too: 2 (h + 4f), whatever the precision (no Transformer Engine)."""
    graph = build_graph(SMALL, batch=B)
    tokens = S * B
    megatron = (H + 4 * F + F) if fp8 else 2 * (H + 2 * F + F)
    assert _saved_bytes(graph, "layers.0.mlp.", Runtime.MEGATRON, fp8) == megatron * tokens
    for other in (Runtime.NANOTRON, Runtime.TORCH, Runtime.DEEPSPEED):
        assert _saved_bytes(graph, "layers.0.mlp.", other, fp8) == 2 * (H + 4 * F) * tokens


def _unfused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Runtime, "fuses_gated_activation", property(lambda self: False))


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
@pytest.mark.parametrize(("tp", "sp"), [(1, False), (2, False), (4, True)])
@pytest.mark.parametrize("recompute", [Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL])
def test_the_fusion_keeps_one_silu_output_less_per_layer(monkeypatch: pytest.MonkeyPatch, precision: str, tp: int,
                                                          sp: bool, recompute: Recompute) -> None:
    """The megatron runtime with and without the fusion: 2·s·b·f/t bytes less a layer (the bf16 SiLU
    output, split over the ffn dim with or without sequence parallelism), kept by every layer
    (no or selective recomputation, which recomputes the attention core only), or, under full
    recomputation, by the one layer whose backward rebuilt it (temporary)."""
    def stage(fused: bool) -> tuple[float, float]:
        if not fused:
            _unfused(monkeypatch)
        par = ParallelConfig(tp=tp, sequence_parallel=sp, recompute=recompute, precision=precision)
        st = plan_memory(build_graph(SMALL, batch=B), par).stages[0]
        return st.activation_bytes_per_microbatch, st.memory.bytes.temporary

    (kept, temp), (kept_unfused, temp_unfused) = stage(True), stage(False)
    layer = 2 * S * B * F / tp
    if recompute is Recompute.FULL:
        assert (kept_unfused - kept, temp_unfused - temp) == (0, layer)
    else:
        assert (kept_unfused - kept, temp_unfused - temp) == (SMALL.layers * layer, 0)


def test_moe_experts_and_shared_experts_fuse_too() -> None:
    """``TEGroupedMLP`` runs ``weighted_bias_swiglu_impl`` (``moe/experts.py``), the shared experts
    ``bias_swiglu_impl`` (``moe/shared_experts.py``): each product keeps its up half only."""
    cfg = get_preset("mixtral-8x7b").with_(layers=1, hidden=H, heads=8, kv_heads=8, ffn=F, vocab=512, seq_len=S,
                                           num_experts=4, shared_experts=1)
    graph = build_graph(cfg, batch=B)
    for mlp in ("layers.0.moe.experts", "layers.0.moe.shared"):
        mul, act, up = (graph.node(f"{mlp}.{op}") for op in ("mul", "act", "up"))
        assert fused_swiglu_activation(mul, graph) is act
        kept = {it.key for it in saved_items(graph, [mul], 2, flash_attention=True, recompute=Recompute.NONE)}
        assert kept == {up.id}
        kept = {it.key for it in saved_items(graph, [mul], 2, flash_attention=True, recompute=Recompute.NONE,
                                             runtime=Runtime.NANOTRON)}
        assert kept == {up.id, act.id}


@pytest.mark.parametrize("cfg", [get_preset("gpt-1.7b"), get_preset("t5-11b")], ids=["gelu", "t5-gated-gelu"])
def test_no_other_mlp_is_a_fused_swiglu(cfg: TransformerConfig) -> None:
    """GPT's GELU MLP has no product; T5's gated GELU is not Megatron-LM's SwiGLU fusion."""
    graph = build_graph(cfg.with_(layers=1), seq_len=64)
    assert not any(fused_swiglu_activation(n, graph) for n in graph.nodes)


def test_no_bias_swiglu_fusion_without_swiglu_is_inert() -> None:
    """Megatron-LM reads ``--no-bias-swiglu-fusion`` only with ``--swiglu`` (``argument_utils.py``:
    ``bias_activation_fusion = args.bias_swiglu_fusion`` under ``args.swiglu``), so a GELU model's is
    listed as ignored (with ``--swiglu`` it is refused: tests/cli/test_cli_import.py)."""
    imported = read_megatron_args("--num-layers 2 --hidden-size 256 --num-attention-heads 8 --seq-length 128 "
                                  "--max-position-embeddings 128 --vocab-size 512 --micro-batch-size 1 "
                                  "--global-batch-size 8 --no-bias-swiglu-fusion", gpus=8)
    assert "--no-bias-swiglu-fusion" in imported.ignored

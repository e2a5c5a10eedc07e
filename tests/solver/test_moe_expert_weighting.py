"""What a mixture-of-experts layer keeps for backward, as Megatron-LM and torchtitan run it.

Megatron-LM multiplies each routed token by its router probability inside the expert, after the
activation (``megatron/core/transformer/moe/experts.py``: ``TEGroupedMLP``'s ``bias_act_func``,
``MLP.forward``'s ``per_token_scale``), and its token dispatchers bring the experts' outputs back with
``unpermute`` without probabilities (a ``scatter_add_``/``index_add_`` whose backward reads only the
indices). Per MoE layer and token (T tokens, k experts each, hidden h, expert width f, E experts, bf16):
the router keeps its input (h) and the probabilities (E); every routed token keeps fc1's input (h),
the activation's input (GELU: f; the fused SwiGLU ``weighted_bias_swiglu_impl``: fc1's output, 2f),
the activation's output the probability product keeps (GELU: f; the fused SwiGLU keeps none) and
fc2's input (f): ``2 (T h + T E + k T (h + 3 f))`` bytes either way. A combine that weights the experts'
outputs itself (the other runtimes) keeps those outputs (k T h) instead, and no activation output.
"""

from __future__ import annotations

import pytest

from parplan.solver.cost.activations import Recompute, saved_items
from parplan.solver.cost.runtime import Runtime
from parplan.solver.errors import ConfigError
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.config import TransformerConfig, extra_features
from parplan.solver.ir import Graph

S, B, H, F, E, K = 128, 2, 256, 1024, 8, 2
T = S * B
GPT_MOE = TransformerConfig(family="gpt", name="gpt-moe", layers=2, hidden=H, heads=8, ffn=F, vocab=512, seq_len=S,
                            num_experts=E, top_k=K, dropout=0.0)
MIXTRAL = TransformerConfig(family="mixtral", name="mixtral", layers=2, hidden=H, heads=8, ffn=F, vocab=512,
                            seq_len=S, num_experts=E, top_k=K, tied_embeddings=False)


def _moe_bytes(graph: Graph, runtime: Runtime) -> float:
    """Bytes layer 0's MoE operators keep for backward, each buffer once."""
    nodes = [n for n in graph.nodes if n.id.startswith("layers.0.moe.")]
    items = {it.key: it for it in saved_items(graph, nodes, 2, flash_attention=True, recompute=Recompute.NONE,
                                              runtime=runtime)}
    return sum(it.total_bytes for it in items.values())


@pytest.mark.parametrize("cfg", [GPT_MOE, MIXTRAL], ids=["gelu", "swiglu"])
def test_megatron_weights_the_experts_in_their_activation(cfg: TransformerConfig) -> None:
    assert _moe_bytes(build_graph(cfg, batch=B), Runtime.MEGATRON) == 2 * (T * H + T * E + K * T * (H + 3 * F))


def test_a_combine_that_weights_the_outputs_keeps_them() -> None:
    """torchtitan: the GELU expert keeps fc1's input, GELU's input and fc2's input, the combine the
    experts' outputs (k T h); a SwiGLU expert run as two operators keeps the gate, the SiLU output and
    the up half, and fc2's input (4f)."""
    for cfg, per_token in ((GPT_MOE, 2 * H + 2 * F), (MIXTRAL, 2 * H + 4 * F)):
        kept = _moe_bytes(build_graph(cfg, batch=B), Runtime.TORCHTITAN)
        assert kept == 2 * (T * H + T * E + K * T * per_token)


def test_a_gpt_with_experts_has_gelu_experts_and_its_own_parameter_count() -> None:
    """GPT blocks (LayerNorm, learned positions, biases) whose MLP is E GELU experts of fc1 (h x f) and
    fc2 (f x h), a router (h x E), no expert biases without ``moe_bias``; tied embeddings."""
    graph = build_graph(GPT_MOE.with_(layers=1), batch=1)
    assert "layers.0.moe.experts.fc1" in graph and "layers.0.moe.experts.gate" not in graph
    assert graph.node("layers.0.moe.experts.act").attrs["fn"] == "gelu"
    attention = 4 * H * H + 4 * H  # q, k, v, o and their biases
    block = 2 * 2 * H + attention + H * E + E * 2 * H * F
    assert graph.parameter_count() == 512 * H + S * H + block + 2 * H


def test_only_gpt_and_mixtral_have_experts_and_exports_refuse_a_gpts() -> None:
    with pytest.raises(ConfigError, match="gpt and mixtral models only"):
        TransformerConfig(family="llama", name="x", layers=1, hidden=H, heads=8, ffn=F, vocab=512, num_experts=4)
    with pytest.raises(ConfigError, match="top_k"):
        GPT_MOE.with_(top_k=E + 1)
    assert any("GELU experts" in f for f in extra_features({"family": "gpt", "num_experts": E}))
    assert extra_features({"family": "mixtral", "num_experts": E}) == []

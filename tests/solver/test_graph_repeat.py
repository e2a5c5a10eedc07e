"""Tracing a few layers and growing the graph to the full depth gives the graph of tracing every
layer, node for node (the oracle: the full trace), for uniform layers, a dense prefix before MoE
layers, and alternating layer patterns; a pattern that does not hold is refused, not grown."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from parplan.solver.frontends.graph_repeat import IdShift, expand_graph  # noqa: E402
from parplan.solver.frontends.hf_trace import build_meta_model, trace_hf_config, trace_model  # noqa: E402
from parplan.solver.frontends.layer_pattern import LayerPattern, cut_to_pattern, find_pattern  # noqa: E402
from parplan.solver.ir import Graph  # noqa: E402

DATA = Path(__file__).resolve().parent.parent / "data" / "hf"
BATCH, SEQ = 2, 32
#: Tiny configs deep enough for a pattern: (fixture, overrides, expected (prefix, period)).
CASES: dict[str, tuple[str, dict[str, Any], tuple[int, int]]] = {
    # Qwen2.5-7B's config made tiny: uniform layers
    "qwen2": ("qwen2", {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
                        "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 64,
                        "num_hidden_layers": 7}, (1, 1)),
    # sliding and full attention alternate: a period of 2 layers
    "gemma2": ("gemma2", {"num_hidden_layers": 10}, (1, 2)),
    # two dense layers, then MoE layers (multi-head latent attention throughout)
    "deepseek_v3": ("deepseek_v3", {"num_hidden_layers": 8, "first_k_dense_replace": 2}, (2, 1)),
    # a MoE MLP every second layer, a dense one in between
    "qwen2_moe": ("qwen2_moe", {"num_hidden_layers": 10, "decoder_sparse_step": 2}, (1, 2)),
}


def _config(case: str) -> dict[str, Any]:
    fixture, overrides, _ = CASES[case]
    cfg: dict[str, Any] = json.loads((DATA / f"{fixture}.json").read_text()) | overrides
    return cfg


def _grown(cfg: dict[str, Any]) -> tuple[LayerPattern, Graph | None]:
    """The pattern, and the graph grown from the cut model's trace (None if refused)."""
    model, _ = build_meta_model(cfg)
    pattern = find_pattern(model, model.config)
    assert pattern is not None
    cut_to_pattern(model, model.config, pattern)
    ids = torch.zeros(BATCH, SEQ, dtype=torch.long, device="meta")
    traced = trace_model(model, {"input_ids": ids, "labels": ids}, "m", dim_names={BATCH: "batch", SEQ: "seq"})
    assert len([u for u in traced.meta["units"] if u.startswith(pattern.path)]) == pattern.traced
    return pattern, expand_graph(traced, pattern)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_grown_graph_is_the_trace_of_every_layer(case: str) -> None:
    cfg = _config(case)
    pattern, grown = _grown(cfg)
    assert (pattern.prefix, pattern.period) == CASES[case][2]
    assert pattern.traced < cfg["num_hidden_layers"]
    assert grown is not None
    full = trace_hf_config(cfg, "m", seq_len=SEQ, batch=BATCH, every_layer=True)
    assert len(grown.nodes) == len(full.nodes)
    for g, f in zip(grown.nodes, full.nodes, strict=True):
        assert g == f
    assert dict(grown.meta) == dict(full.meta)
    if case == "qwen2":  # the default path grows it too
        assert trace_hf_config(cfg, "m", seq_len=SEQ, batch=BATCH).nodes == full.nodes


def test_a_period_that_does_not_repeat_is_refused() -> None:
    """Gemma-2 alternates two kinds of layer: claiming a period of one layer must not grow a graph."""
    cfg = _config("gemma2")
    model, _ = build_meta_model(cfg)
    wrong = LayerPattern("model.layers", layers=10, prefix=1, period=1, traced=4)
    cut_to_pattern(model, model.config, wrong)
    ids = torch.zeros(BATCH, SEQ, dtype=torch.long, device="meta")
    traced = trace_model(model, {"input_ids": ids, "labels": ids}, "m", dim_names={BATCH: "batch", SEQ: "seq"})
    assert expand_graph(traced, wrong) is None


def test_shallow_models_are_traced_whole() -> None:
    """Two layers leave nothing to repeat (the fixtures as they are)."""
    model, _ = build_meta_model(json.loads((DATA / "qwen2_moe.json").read_text()))
    assert find_pattern(model, model.config) is None


def test_id_shift_moves_counters_and_keeps_text() -> None:
    shift = IdShift.learn([("model.layers.1.mlp.linear_7", "model.layers.2.mlp.linear_14"),
                           ("model.layers.1.mlp.experts.to_3.mul", "model.layers.2.mlp.experts.to_5.mul"),
                           ("model.layers.1.self_attn.mul_4", "model.layers.2.self_attn.mul_9")])
    assert shift is not None
    assert shift("model.layers.3.mlp.linear_21", 2) == "model.layers.5.mlp.linear_35"
    # ``.mul`` there is a suffix the tracer adds, not fx's first ``mul``: it stays
    assert shift("model.layers.3.mlp.experts.to_7.mul", 1) == "model.layers.4.mlp.experts.to_9.mul"
    assert IdShift.learn([("a.linear_1", "a.linear_3"), ("b.linear_2", "b.linear_5")]) is None
    assert IdShift.learn([("a.q_proj", "a.k_proj")]) is None

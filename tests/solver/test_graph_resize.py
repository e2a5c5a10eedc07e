"""Resizing a graph along ``batch`` and ``seq``: names a rename reshape joins follow each other, and
a traced model resized to another micro-batch or sequence length is the graph traced at that size."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from parplan.solver.errors import ConfigError
from parplan.solver.frontends.resize import linked_dims, resize_graph
from parplan.solver.ir import Graph, OpKind, make_node

DATA = Path(__file__).resolve().parents[1] / "data"


def _attention_like(*, merged: bool = False) -> Graph:
    """q and k over one sequence axis; the keys' copy is renamed ``kv_seq`` by a reshape, as the
    tracer writes ``q @ k^T``; a parameter's reshape joins nothing, nor (``merged``) a reshape that
    merges two dims into one."""
    nodes = [
        make_node("x", OpKind.INPUT, [], (("batch", 2), ("seq", 8), ("hidden", 4))),
        make_node("w", OpKind.PARAMETER, [], (("hidden", 4), ("seq_w", 8))),
        make_node("w.view", OpKind.RESHAPE, ["w"], (("hidden", 4), ("kv_w", 8))),
        make_node("k.view", OpKind.RESHAPE, ["x"], (("batch", 2), ("kv_seq", 8), ("hidden", 4))),
        make_node("scores", OpKind.EINSUM, ["x", "k.view"], (("batch", 2), ("seq", 8), ("kv_seq", 8)),
                  equation="batch seq hidden, batch kv_seq hidden -> batch seq kv_seq"),
    ]
    if merged:
        nodes.append(make_node("flat", OpKind.RESHAPE, ["scores"], (("batch", 2), ("pairs", 64))))
    return Graph.of("attn", nodes, {"batch": 2, "seq_len": 8})


def test_a_rename_joins_two_names_and_nothing_else_does() -> None:
    links = linked_dims(_attention_like(merged=True))
    assert links["seq"] == links["kv_seq"]
    assert len({links[d] for d in ("batch", "seq", "hidden", "pairs", "kv_w")}) == 5
    assert "seq_w" not in links  # a parameter keeps its sizes: its reshape's output is joined to nothing


def test_resizing_seq_resizes_its_renamed_copy() -> None:
    g = resize_graph(_attention_like(), {"batch": 1, "seq": 16})
    assert g.node("scores").shape == {"batch": 1, "seq": 16, "kv_seq": 16}
    assert g.node("k.view").shape == {"batch": 1, "kv_seq": 16, "hidden": 4}
    assert g.node("w").shape == {"hidden": 4, "seq_w": 8}
    assert dict(g.meta) == {"batch": 1, "seq_len": 16}
    with pytest.raises(ConfigError, match="cannot be resized"):  # 'pairs' is seq x kv_seq: not renamed
        resize_graph(_attention_like(merged=True), {"seq": 16})
    with pytest.raises(ConfigError, match="seq and kv_seq are one axis"):
        resize_graph(_attention_like(), {"seq": 16, "kv_seq": 4})


def _traced(batch: int, seq: int) -> Graph:
    torch = pytest.importorskip("torch")
    from parplan.solver.frontends.hf_trace import trace_model

    sys.path.insert(0, str(DATA))
    try:
        import mha_factory
    finally:
        sys.path.remove(str(DATA))
    with torch.device("meta"):
        model: Any = mha_factory.make()
    ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    return trace_model(model, (ids,), "mha", dim_names={batch: "batch", seq: "seq"})


def test_a_traced_multihead_attention_model_resized_is_the_model_traced_at_that_size() -> None:
    """nn.MultiheadAttention computes q @ k^T over one sequence axis (kv_seq is its renamed copy):
    the graph traced at 2 x 16 and resized to 1 x 16 then 4 x 24 is node for node the graph traced at
    4 x 24 (a trace at one sample would lose the batch axis, so one sample is reached by resizing)."""
    small = _traced(2, 16)
    assert {"seq", "kv_seq"} <= {d for n in small.nodes for d, _ in n.dims}
    one = resize_graph(small, {"batch": 1})
    assert one.meta["batch"] == 1 and one.node("input_ids").shape == {"batch": 1, "seq": 16}
    direct = _traced(4, 24)
    assert resize_graph(one, {"batch": 4, "seq": 24}).nodes == direct.nodes


@pytest.mark.parametrize(("batch", "seq"), [(1, 16), (4, 24), (3, 7)])
def test_a_mixture_of_experts_resized_is_the_model_built_at_that_size(batch: int, seq: int) -> None:
    """The experts' capacity follows the tokens they route: DeepSeek-V3's layout (2 of 8 experts,
    a shared one, a dense first layer) built at 2 x 16 and resized is node for node the builder's
    graph at the new size (capacity ceil(tokens x 2 / 8))."""
    from parplan.solver.frontends.builder import build_graph
    from parplan.solver.frontends.presets import get_preset

    cfg = get_preset("deepseek-v3").with_(name="t", layers=3, hidden=64, heads=4, head_dim=16, ffn=32, vocab=256,
                                          num_experts=8, top_k=2, dense_layers=1, dense_ffn=128, q_lora_rank=32,
                                          kv_lora_rank=32, qk_rope_dim=8, v_head_dim=16, seq_len=64)
    resized = resize_graph(build_graph(cfg, batch=2, seq_len=16), {"batch": batch, "seq": seq})
    direct = build_graph(cfg, batch=batch, seq_len=seq)
    assert {d: s for n in direct.nodes for d, s in n.dims}["capacity"] == -(-batch * seq * 2 // 8)
    assert resized.nodes == direct.nodes

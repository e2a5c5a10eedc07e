"""FLOP counts, memory traffic and roofline times of single operators."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from parplan.solver.calibration import Calibration
from parplan.solver.cluster import gpu_preset
from parplan.solver.cost.compute import (
    attention_dims,
    backward_flops,
    bytes_moved,
    forward_flops,
    forward_seconds,
    op_seconds,
)
from parplan.solver.errors import ConfigError
from parplan.solver.ir import Graph, Node, OpKind, make_node

small = st.integers(1, 64)


def _graph(*nodes: Node) -> Graph:
    return Graph.of("t", nodes)


@given(small, small, small)
def test_matmul_flops(m: int, k: int, n: int) -> None:
    g = _graph(make_node("x", "input", dims={"m": m, "k": k}),
               make_node("w", "parameter", dims={"k": k, "n": n}),
               make_node("y", "einsum", ["x", "w"], {"m": m, "n": n}, equation="m k, k n -> m n"))
    assert forward_flops(g.node("y"), g) == 2 * m * n * k
    assert backward_flops(g.node("y"), g) == 4 * m * n * k


def test_batched_projection_flops() -> None:
    b, s, h, f = 2, 16, 8, 32
    g = _graph(make_node("x", "input", dims={"batch": b, "seq": s, "hidden": h}),
               make_node("w", "parameter", dims={"hidden": h, "ffn": f}),
               make_node("y", "einsum", ["x", "w"], {"batch": b, "seq": s, "ffn": f},
                         equation="batch seq hidden, hidden ffn -> batch seq ffn"))
    assert forward_flops(g.node("y"), g) == 2 * b * s * h * f  # 2 · parameters · tokens


def _attention_graph(q: dict[str, int], k: dict[str, int], **attrs: Any) -> Graph:
    return _graph(make_node("q", "input", dims=q), make_node("k", "input", dims=k),
                  make_node("v", "input", dims=k), make_node("o", "attention", ["q", "k", "v"], q, **attrs))


@given(small, small, small, small, st.booleans())
def test_self_attention_flops(b: int, s: int, a: int, d: int, causal: bool) -> None:
    dims = {"batch": b, "seq": s, "heads": a, "head_dim": d}
    g = _attention_graph(dims, dims, causal=causal)
    want = 4 * b * a * s * s * d
    assert forward_flops(g.node("o"), g) == pytest.approx(want / 2 if causal else want)


def test_cross_attention_uses_kv_seq() -> None:
    q = {"batch": 2, "seq": 10, "heads": 4, "head_dim": 8}
    k = {"batch": 2, "kv_seq": 7, "heads": 4, "head_dim": 8}
    g = _attention_graph(q, k)
    assert attention_dims(g.node("o"), g.node("q"), g.node("k")) == ("head_dim", "kv_seq")
    assert forward_flops(g.node("o"), g) == 4 * 2 * 4 * 10 * 7 * 8


def test_grouped_query_attention() -> None:
    q = {"batch": 2, "seq": 16, "heads": 8, "head_dim": 4}
    k = {"batch": 2, "seq": 16, "kv_heads": 2, "head_dim": 4}
    g = _attention_graph(q, k, causal=True)
    assert attention_dims(g.node("o"), g.node("q"), g.node("k")) == ("head_dim", "seq")
    assert forward_flops(g.node("o"), g) == 4 * 2 * 8 * 16 * 16 * 4 / 2


def test_attention_heads_before_seq_and_terse_names() -> None:
    # Layout [batch, heads, seq, head_dim] (PyTorch SDPA's).
    dims = {"batch": 2, "heads": 3, "seq": 5, "head_dim": 4}
    g = _attention_graph(dims, dims)
    assert forward_flops(g.node("o"), g) == 4 * 2 * 3 * 5 * 5 * 4
    # Names that say nothing: the documented [batch, seq, heads, head_dim] layout decides.
    terse = {"b": 2, "s": 5, "h": 3, "d": 4}
    g = _attention_graph(terse, terse)
    assert attention_dims(g.node("o"), g.node("q"), g.node("k")) == ("d", "s")
    # ... unless the node names the dim.
    g = _attention_graph(terse, terse, kv_seq_dim="s")
    assert forward_flops(g.node("o"), g) == 4 * 2 * 3 * 5 * 5 * 4


def test_elementwise_and_norm_flops() -> None:
    dims = {"t": 4, "h": 8}
    g = _graph(make_node("x", "input", dims=dims), make_node("y", "input", dims=dims),
               make_node("w", "parameter", dims={"h": 8}),
               make_node("add", "elementwise", ["x", "y"], dims, fn="add"),
               make_node("gelu", "elementwise", ["x"], dims, fn="gelu"),
               make_node("sm", "softmax", ["x"], dims, dim="h"),
               make_node("ln", "layernorm", ["x", "w"], dims, dim="h"),
               make_node("rms", "rmsnorm", ["x", "w"], dims, dim="h"),
               make_node("do", "dropout", ["x"], dims, p=0.1),
               # make_node cannot take attrs.dims (it clashes with its ``dims`` argument).
               Node("r", OpKind.REDUCE, ("x",), (("t", 4),), attrs=MappingProxyType({"dims": ["h"]})),
               make_node("rs", "reshape", ["x"], {"th": 32}))
    per = {"add": 1, "gelu": 8, "sm": 5, "ln": 8, "rms": 5, "do": 2, "r": 1, "rs": 0}
    for nid, flops in per.items():
        assert forward_flops(g.node(nid), g) == flops * 32, nid
    assert forward_flops(g.node("x"), g) == 0
    assert forward_flops(g.node("w"), g) == 0


def test_embedding_and_cross_entropy() -> None:
    g = _graph(make_node("ids", "input", dims={"batch": 2, "seq": 4}, dtype="int64"),
               make_node("table", "parameter", dims={"vocab": 100, "hidden": 8}),
               make_node("emb", "embedding", ["ids", "table"], {"batch": 2, "seq": 4, "hidden": 8}),
               make_node("logits", "input", dims={"batch": 2, "seq": 4, "vocab": 100}),
               make_node("ce", "cross_entropy", ["logits", "ids"], {"batch": 2, "seq": 4}, dtype="fp32"))
    assert forward_flops(g.node("emb"), g) == 0
    assert forward_flops(g.node("ce"), g) == 5 * 800
    # Embedding reads the ids and the 8 gathered rows, not the whole table.
    assert bytes_moved(g.node("emb"), g) == 2 * (8 + 64 + 64)
    assert bytes_moved(g.node("emb"), g, activation_bytes=None) == 8 * 8 + 2 * 64 + 2 * 64


def test_bytes_moved_matmul() -> None:
    g = _graph(make_node("x", "input", dims={"m": 4, "k": 8}),
               make_node("w", "parameter", dims={"k": 8, "n": 2}, dtype="fp32"),
               make_node("y", "einsum", ["x", "w"], {"m": 4, "n": 2}, equation="m k, k n -> m n"))
    assert bytes_moved(g.node("y"), g) == 2 * (32 + 16 + 8)
    assert bytes_moved(g.node("y"), g, activation_bytes=None) == 2 * 32 + 4 * 16 + 2 * 8
    assert bytes_moved(g.node("w"), g) == 0


def test_op_seconds_roofline() -> None:
    a100 = gpu_preset("A100-80GB")
    # Compute-bound: 312 TFLOP at 312 TFLOP/s and 50 % efficiency = 2 s.
    assert op_seconds(312e12, 1.0, a100, "bf16", 0.5, 0.8) == pytest.approx(2.0)
    # Memory-bound: 2039 GB at 2039 GB/s and 50 % = 2 s.
    assert op_seconds(1.0, 2039e9, a100, "bf16", 0.5, 0.5) == pytest.approx(2.0)
    # Defaults: bf16 matmuls at 55 %.
    assert op_seconds(312e12, 0, a100) == pytest.approx(1 / 0.55)
    with pytest.raises(ConfigError, match="fp8"):
        op_seconds(1e12, 0, a100, "fp8")
    # V100 has no tf32: it runs at the fp32 peak.
    assert op_seconds(15.7e12, 0, gpu_preset("V100-32GB"), "tf32", 1.0, 1.0) == pytest.approx(1.0)


def test_forward_seconds_uses_calibration() -> None:
    g = _graph(make_node("x", "input", dims={"m": 4096, "k": 4096}),
               make_node("w", "parameter", dims={"k": 4096, "n": 4096}),
               make_node("y", "einsum", ["x", "w"], {"m": 4096, "n": 4096}, equation="m k, k n -> m n"))
    h100 = gpu_preset("H100-80GB")
    fast = forward_seconds(g.node("y"), g, h100, Calibration(matmul_efficiency={"bf16": 1.0}))
    slow = forward_seconds(g.node("y"), g, h100, Calibration(matmul_efficiency={"bf16": 0.5}))
    assert fast == pytest.approx(2 * 4096**3 / 989.4e12)
    assert slow == pytest.approx(2 * fast)

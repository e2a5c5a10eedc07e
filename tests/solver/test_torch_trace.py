"""Tracing PyTorch modules (built on the meta device) into parplan graphs."""

from __future__ import annotations

import math
import sys
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from parplan.solver.errors import ConfigError
from parplan.solver.frontends.torch_trace import OP_TABLE, trace_module
from parplan.solver.ir import Graph, OpKind, parse_equation
from parplan.solver.validate import validate_graph
from parplan.solver.wire import graph_from_json, graph_to_json

VOCAB, HIDDEN, HEADS, LAYERS, BATCH, SEQ = 128, 64, 4, 2, 2, 16


class Block(nn.Module):
    def __init__(self, h: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(h)
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.ln2 = nn.LayerNorm(h)
        self.fc1 = nn.Linear(h, 4 * h)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * h, h)

    def forward(self, x: Any) -> Any:
        b, t, h = x.shape
        q, k, v = (y.view(b, t, self.heads, h // self.heads).transpose(1, 2)
                   for y in self.qkv(self.ln1(x)).chunk(3, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, h))
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList([Block(HIDDEN, HEADS) for _ in range(LAYERS)])
        self.ln = nn.LayerNorm(HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)
        self.head.weight = self.emb.weight  # tied

    def forward(self, ids: Any, labels: Any) -> Any:
        x = self.emb(ids)
        for layer in self.layers:
            x = layer(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1))


def _ids() -> Any:
    return torch.zeros(BATCH, SEQ, dtype=torch.long, device="meta")


def _check(graph: Graph, module: Any) -> Graph:
    validate_graph(graph)
    assert graph.parameter_count() == sum(p.numel() for p in module.parameters())
    assert graph_from_json(graph_to_json(graph)) == graph
    for n in graph.nodes:
        names = [d for d, _ in n.dims]
        assert len(names) == len(set(names)), n
    return graph


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Graph]:
    with torch.device("meta"):
        model = TinyLM()
    return model, trace_module(model, (_ids(), _ids()), "tiny")


def test_tiny_lm_validates_and_counts_parameters(tiny: tuple[Any, Graph]) -> None:
    model, g = tiny
    _check(g, model)
    assert g.name == "tiny"
    assert g.meta["parameter_count"] == sum(p.numel() for p in model.parameters())
    # the tied head reuses the embedding table: one parameter node
    assert "emb.weight" in g and "head.weight" not in g
    assert {n.id for n in g.parameters()} == {n for n, _ in model.named_parameters()}


def test_tiny_lm_layer_tags(tiny: tuple[Any, Graph]) -> None:
    _, g = tiny
    assert g.meta["units"] == ["embed", "layers.0", "layers.1", "head"]
    groups = g.layers()
    assert {"layers.0", "layers.1"} <= set(groups)
    assert g.node("layers.1.fc1.weight").layer == "layers.1"
    # both blocks have the same structure
    shape = [[(n.kind, dict(n.dims)) for n in groups[f"layers.{i}"]] for i in range(LAYERS)]
    assert shape[0] == shape[1]


def test_tiny_lm_linears_are_einsums(tiny: tuple[Any, Graph]) -> None:
    _, g = tiny
    consumers = g.consumers()
    for name, (n_out, n_in) in {"qkv": (3 * HIDDEN, HIDDEN), "proj": (HIDDEN, HIDDEN),
                                "fc1": (4 * HIDDEN, HIDDEN), "fc2": (HIDDEN, 4 * HIDDEN)}.items():
        w = g.node(f"layers.0.{name}.weight")
        assert w.numel == n_out * n_in
        (mm_id,) = consumers[w.id]
        mm = g.node(mm_id)
        assert mm.kind is OpKind.EINSUM
        (x_names, w_names), out = parse_equation(mm.attrs["equation"])
        contracted = set(x_names) & set(w_names) - set(out)
        sizes = dict(w.dims)
        assert contracted
        assert math.prod(sizes[d] for d in contracted) == n_in
        assert mm.numel == BATCH * SEQ * n_out
        bias = g.node(consumers[mm_id][0])
        assert bias.kind is OpKind.ELEMENTWISE and bias.attrs["fn"] == "add"
        assert f"layers.0.{name}.bias" in bias.inputs
    lm = g.node(consumers["emb.weight"][-1])
    assert lm.kind is OpKind.EINSUM and dict(lm.dims) == {"batch": BATCH, "seq": SEQ, "vocab": VOCAB}


def test_tiny_lm_named_dims(tiny: tuple[Any, Graph]) -> None:
    _, g = tiny
    assert dict(g.node("emb.weight").dims) == {"vocab": VOCAB, "hidden": HIDDEN}
    assert dict(g.node("layers.0.fc1.weight").dims) == {"ffn": 4 * HIDDEN, "hidden": HIDDEN}
    # the fused qkv weight is split into its parts and heads, the output projection reads heads
    assert dict(g.node("layers.0.qkv.weight").dims) == {"qkv": 3, "heads": HEADS, "head_dim": HIDDEN // HEADS,
                                                         "hidden": HIDDEN}
    assert dict(g.node("layers.0.proj.weight").dims) == {"hidden": HIDDEN, "heads": HEADS,
                                                          "head_dim": HIDDEN // HEADS}
    (attn,) = [n for n in g.nodes if n.kind is OpKind.ATTENTION and n.layer == "layers.0"]
    assert attn.attrs["causal"] is True
    assert dict(attn.dims) == {"batch": BATCH, "heads": HEADS, "seq": SEQ, "head_dim": HIDDEN // HEADS}
    (ce,) = [n for n in g.nodes if n.kind is OpKind.CROSS_ENTROPY]
    assert ce.attrs["class_dim"] == "vocab" and dict(ce.dims) == {"batch": BATCH, "seq": SEQ}
    loss = g.node(g.consumers()[ce.id][0])
    assert loss.kind is OpKind.REDUCE and loss.dims == () and loss.attrs["op"] == "mean"


def test_tiny_lm_dim_names_and_dtype() -> None:
    with torch.device("meta"):
        model = TinyLM()
    g = _check(trace_module(model, {"ids": _ids(), "labels": _ids()}, dim_names={BATCH: "b", SEQ: "tokens"},
                            float_dtype="bf16"), model)
    assert dict(g.node("ids").dims) == {"b": BATCH, "tokens": SEQ}
    assert g.node("ids").dtype == "int64"
    assert g.node("layers.0.fc1.weight").dtype == "bf16"


def test_square_weight_residual_keeps_two_axes() -> None:
    class Residual(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x: Any) -> Any:
            return x + self.lin(x)

    with torch.device("meta"):
        model = Residual()
    g = _check(trace_module(model, (torch.zeros(2, 4, 8, device="meta"),)), model)
    w = g.node("lin.weight")
    assert len(dict(w.dims)) == 2  # [out, in] stay two dims though both are 8 and feed the residual
    assert any(n.kind is OpKind.RESHAPE for n in g.nodes)  # the zero-cost rename to the residual's dim


def test_manual_attention_scores_get_a_second_sequence_dim() -> None:
    class Manual(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.v = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16)

        def forward(self, x: Any) -> Any:
            b, t, h = x.shape
            q, k, v = (m(x).view(b, t, 2, 8).transpose(1, 2) for m in (self.q, self.k, self.v))
            att = ((q @ k.transpose(-2, -1)) / 8**0.5).softmax(-1)
            return (att @ v).transpose(1, 2).reshape(b, t, h).sum()

    with torch.device("meta"):
        model = Manual()
    g = _check(trace_module(model, (torch.zeros(2, 4, 16, device="meta"),)), model)
    (sm,) = [n for n in g.nodes if n.kind is OpKind.SOFTMAX]
    assert sorted(dict(sm.dims).values()) == [2, 2, 4, 4]  # [batch, heads, seq, kv_seq], all named apart
    assert sm.attrs["dim"] in dict(sm.dims)


def test_more_ops_map() -> None:
    class More(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.RMSNorm(8)
            self.w = nn.Parameter(torch.empty(4, 8))
            self.s = nn.Parameter(torch.empty(()))
            self.out = nn.Linear(16, 10)

        def forward(self, x: Any, target: Any) -> Any:
            x = self.norm(x)
            y = torch.einsum("bsh,eh->bse", x, self.w).relu()
            z = torch.stack([x * 2.0, x - 1.0], dim=1).mean(dim=1)
            u = torch.cat([z, x * self.s], dim=-1)
            logp = F.log_softmax(self.out(u), dim=-1)
            return y.sum() + F.nll_loss(logp.flatten(0, 1), target.flatten())

    with torch.device("meta"):
        model = More()
    g = _check(trace_module(model, (torch.zeros(2, 4, 8, device="meta"),
                                    torch.zeros(2, 4, dtype=torch.long, device="meta"))), model)
    kinds = {n.kind for n in g.nodes}
    assert {OpKind.RMSNORM, OpKind.EINSUM, OpKind.CONCAT, OpKind.REDUCE, OpKind.SOFTMAX,
            OpKind.CROSS_ENTROPY} <= kinds


class _Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: Any) -> Any:
        return torch.cumsum(self.lin(x), dim=-1)


def test_unsupported_op_raises_config_error_naming_op_and_module() -> None:
    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = _Inner()

        def forward(self, x: Any) -> Any:
            return self.body(x)

    with torch.device("meta"):
        model = Outer()
    with pytest.raises(ConfigError, match=r"cumsum.*'body'"):
        trace_module(model, (torch.zeros(2, 8, device="meta"),))


def test_ops_on_inputs_alone_are_not_errors() -> None:
    class Prep(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x: Any) -> Any:
            return self.lin(torch.cumsum(x, dim=-1))  # cumsum of an input: a derived input

    with torch.device("meta"):
        model = Prep()
    g = _check(trace_module(model, (torch.zeros(2, 8, device="meta"),)), model)
    derived = [n for n in g.nodes if n.kind is OpKind.INPUT and n.attrs.get("derived_from") == ["x"]]
    assert len(derived) == 1


def test_bad_arguments() -> None:
    with pytest.raises(ConfigError, match=r"nn\.Module"):
        trace_module(object(), ())
    with torch.device("meta"):
        model = nn.Linear(2, 2)
    with pytest.raises(ConfigError, match="float_dtype"):
        trace_module(model, (torch.zeros(2, device="meta"),), float_dtype="fp64")


def test_op_table_is_explicit() -> None:
    for op in ("linear", "addmm", "matmul", "embedding", "layer_norm", "rms_norm", "softmax",
               "scaled_dot_product_attention", "cross_entropy_loss", "cat", "view", "chunk", "dropout"):
        assert op in OP_TABLE


def test_missing_torch_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ConfigError, match=r"parplan\[torch\]"):
        trace_module(None, ())


# -- Hugging Face models ------------------------------------------------------------------------


def _hf_graph(model: Any) -> Graph:
    g = trace_module(model, {"input_ids": _ids(), "labels": _ids()})
    return _check(g, model)


def test_gpt2_lm_head_model() -> None:
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=32))
    g = _hf_graph(model)
    assert g.meta["units"] == ["embed", "transformer.h.0", "transformer.h.1", "head"]
    assert dict(g.node("transformer.wpe.weight").dims) == {"positions": 32, "hidden": 64}
    assert dict(g.node("transformer.h.1.attn.c_attn.weight").dims) == {"hidden": 64, "qkv": 3, "heads": 4,
                                                                        "head_dim": 16}
    assert dict(g.node("transformer.h.0.mlp.c_fc.weight").dims) == {"hidden": 64, "ffn": 256}
    kinds = [n.kind for n in g.nodes]
    assert kinds.count(OpKind.ATTENTION) == 2 and kinds.count(OpKind.LAYERNORM) == 5
    assert kinds.count(OpKind.CROSS_ENTROPY) == 1
    gelu = [n for n in g.nodes if n.kind is OpKind.ELEMENTWISE and n.attrs.get("fn") == "gelu"]
    assert len(gelu) == 2  # NewGELUActivation is recognised as one node


def test_llama_for_causal_lm() -> None:
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, max_position_embeddings=32))
    g = _hf_graph(model)
    assert g.meta["units"] == ["embed", "model.layers.0", "model.layers.1", "head"]
    kinds = [n.kind for n in g.nodes]
    assert kinds.count(OpKind.RMSNORM) == 5  # LlamaRMSNorm is recognised as one node
    assert kinds.count(OpKind.ATTENTION) == 2
    assert dict(g.node("model.layers.0.self_attn.k_proj.weight").dims) == {"kv_heads": 2, "head_dim": 16,
                                                                          "hidden": 64}
    assert dict(g.node("model.layers.0.mlp.up_proj.weight").dims) == {"ffn": 128, "hidden": 64}
    (attn,) = [n for n in g.nodes if n.kind is OpKind.ATTENTION and n.layer == "model.layers.1"]
    assert attn.attrs["head_dim"] == "head_dim" and attn.attrs["kv_seq_dim"] == "seq"
    assert g.node("lm_head.weight").numel == 128 * 64  # untied

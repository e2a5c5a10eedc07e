"""Tracing mixture-of-experts routing and interleaved slices (issue 13): ``topk`` routers, a
routed-experts module as dispatch / expert einsums / combine, ``gather`` and ``masked_fill`` in
routers, and ``x[..., ::2]``."""

from __future__ import annotations

import math
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from parplan.solver.errors import ConfigError
from parplan.solver.frontends.torch_trace import trace_module
from parplan.solver.ir import Graph, OpKind
from parplan.solver.validate import validate_graph

B, S, H, FFN, E, K = 2, 8, 16, 24, 4, 2


def _check(graph: Graph, module: Any) -> Graph:
    validate_graph(graph)
    assert graph.parameter_count() == sum(p.numel() for p in module.parameters())
    return graph


class Experts(nn.Module):
    """Routed experts as transformers stores them: [E, 2F, H] and [E, H, F] (computed densely here;
    the tracer maps the call as a whole, whatever its inside)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(E, 2 * FFN, H))
        self.down_proj = nn.Parameter(torch.empty(E, H, FFN))

    def forward(self, x: Any, index: Any, weights: Any) -> Any:
        gate, up = torch.einsum("th,efh->etf", x, self.gate_up_proj).chunk(2, dim=-1)
        y = torch.einsum("etf,ehf->eth", F.silu(gate) * up, self.down_proj)
        combine = (F.one_hot(index, E).to(x.dtype) * weights[..., None]).sum(1)
        return torch.einsum("eth,te->th", y, combine)


class Moe(nn.Module):
    def __init__(self, grouped: bool = False) -> None:
        super().__init__()
        self.router = nn.Linear(H, E, bias=False)
        self.experts = Experts()
        self.grouped = grouped

    def forward(self, x: Any) -> Any:
        t = x.reshape(-1, H)
        probs = self.router(t).softmax(dim=-1)
        if self.grouped:  # DeepSeek-style: keep the best group, pick top-k in it, gather the weights
            best = probs.view(-1, 2, E // 2).topk(1, dim=-1)[0].sum(-1).topk(1, dim=-1)[1]
            mask = torch.zeros(t.shape[0], 2, device=t.device).scatter(1, best, 1.0)
            keep = mask.unsqueeze(-1).expand(-1, 2, E // 2).reshape(-1, E).bool()
            index = probs.masked_fill(~keep, 0.0).topk(K, dim=-1)[1]
            weights = probs.gather(1, index)
        else:
            weights, index = probs.topk(K, dim=-1)
            weights = weights / weights.sum(-1, keepdim=True)
        return x + self.experts(t, index, weights).reshape(x.shape)


@pytest.mark.parametrize("grouped", [False, True])
def test_routed_experts_are_dispatch_einsums_combine(grouped: bool) -> None:
    with torch.device("meta"):
        model = Moe(grouped)
    g = _check(trace_module(model, (torch.zeros(B, S, H, device="meta"),), dim_names={S: "seq"}), model)
    (dispatch,) = [n for n in g.nodes if n.kind is OpKind.DISPATCH]
    (combine,) = [n for n in g.nodes if n.kind is OpKind.COMBINE]
    capacity = math.ceil(B * S * K / E)
    assert dict(dispatch.dims) == {"expert": E, "capacity": capacity, "hidden": H}
    assert dispatch.attrs["top_k"] == K
    assert dict(combine.dims) == {"batch": B, "seq": S, "hidden": H}
    router = g.node(dispatch.inputs[1])  # the probabilities (DeepSeek-style: masked to the best group)
    assert combine.inputs[1] == router.id
    if grouped:  # masked_fill by the group mask: a mul of the softmax
        assert router.attrs["fn"] == "mul"
        router = g.node(router.inputs[0])
    assert router.kind is OpKind.SOFTMAX
    # the experts' einsums: E x capacity tokens through [2F, H] and [H, F]: top_k x a dense MLP per token
    einsums = [n for n in g.nodes if n.kind is OpKind.EINSUM and "capacity" in n.shape]
    contracted = [set(g.node(n.inputs[0]).shape) - set(n.shape) for n in einsums]
    assert contracted == [{"hidden"}, {"ffn"}]
    expert_flops = sum(2 * n.numel * g.node(n.inputs[0]).shape[c.pop()] for n, c in zip(einsums, contracted,
                                                                                         strict=True))
    assert expert_flops == 2 * E * capacity * (H * 2 * FFN + FFN * H) == 2 * B * S * K * 3 * H * FFN


def test_unrouted_3d_weights_are_traced_op_by_op() -> None:
    """A module of 3-D weights called without a top-k router before it is not collapsed."""

    class Batched(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.experts = Experts()

        def forward(self, x: Any) -> Any:
            t = x.reshape(-1, H)
            ones = torch.zeros(t.shape[0], K, dtype=torch.long, device=t.device)
            return self.experts(t, ones, torch.ones(t.shape[0], K, device=t.device))

    with torch.device("meta"):
        model = Batched()
    g = _check(trace_module(model, (torch.zeros(B, S, H, device="meta"),)), model)
    assert not any(n.kind in (OpKind.DISPATCH, OpKind.COMBINE) for n in g.nodes)


def test_interleaved_halves_are_a_reshape_and_selects() -> None:
    class Interleaved(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(H, H)

        def forward(self, x: Any) -> Any:
            y = self.lin(x)
            return y[..., ::2] * y[..., 1::2]

    with torch.device("meta"):
        model = Interleaved()
    g = _check(trace_module(model, (torch.zeros(B, S, H, device="meta"),)), model)
    selects = [n for n in g.nodes if n.kind is OpKind.REDUCE and n.attrs.get("op") == "select"]
    assert sorted(n.attrs["index"] for n in selects) == [0, 1]
    assert all(n.numel == B * S * H // 2 for n in selects)


def test_other_strided_slices_still_raise() -> None:
    class Thirds(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(H, H)

        def forward(self, x: Any) -> Any:
            return self.lin(x)[..., 1:10:3]

    with torch.device("meta"):
        model = Thirds()
    with pytest.raises(ConfigError, match="strided slice"):
        trace_module(model, (torch.zeros(B, S, H, device="meta"),))


def test_masked_fill_by_an_input_mask_is_a_mul() -> None:
    class Masked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(32, H)

        def forward(self, ids: Any) -> Any:
            return self.emb(ids).masked_fill((ids == 0)[..., None], 0.0)

    with torch.device("meta"):
        model = Masked()
    g = _check(trace_module(model, (torch.zeros(B, S, dtype=torch.long, device="meta"),)), model)
    (mul,) = [n for n in g.nodes if n.kind is OpKind.ELEMENTWISE]
    assert mul.attrs["fn"] == "mul" and g.node(mul.inputs[1]).kind is OpKind.INPUT


def test_top1_of_128_is_one_select_of_a_128_way_split() -> None:
    """The top-1 value over 128 experts: one select (the 127 other pieces are never made)."""

    class Top1(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.router = nn.Linear(H, 128, bias=False)

        def forward(self, x: Any) -> Any:
            return x * self.router(x).softmax(dim=-1).topk(1, dim=-1)[0]

    with torch.device("meta"):
        model = Top1()
    g = _check(trace_module(model, (torch.zeros(B, S, H, device="meta"),)), model)
    (sel,) = [n for n in g.nodes if n.kind is OpKind.REDUCE and n.attrs.get("op") == "select"]
    assert sel.numel == B * S and sel.attrs["index"] == 0
    assert g.node(sel.inputs[0]).numel == B * S * 128

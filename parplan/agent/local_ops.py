"""The operators of an ILP plan's graph on one device's local tensors (:mod:`.plan_interpreter`
hands them the local shards): a linear layer's einsum as one matmul of views, elementwise
operators broadcast by name, causal attention through PyTorch's fused kernel, RMSNorm keeping
``x`` and ``rstd`` for backward (as fused GPU kernels do), a vocabulary-split embedding that looks
up its own rows only, and the per-token cross entropy."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - PyTorch's convention

from parplan.agent import graph_ops
from parplan.solver.errors import StrategyError
from parplan.solver.ir import Graph, Node


def _letters(names: list[str]) -> dict[str, str]:
    return {n: "abcdefghijklmnopqrstuvwxyz"[i] for i, n in enumerate(dict.fromkeys(names))}


def einsum(node: Node, ins: list[torch.Tensor], graph: Graph) -> torch.Tensor:
    operands = [[d for d, _ in graph.node(i).dims] for i in node.inputs]
    result = [d for d, _ in node.dims]
    if len(ins) == 2:
        y = as_matmul(ins[0], ins[1], operands[0], operands[1], result)
        if y is not None:
            return y
    letter = _letters([d for ds in operands for d in ds] + result)
    eq = ",".join("".join(letter[d] for d in ds) for ds in operands) + "->" + "".join(letter[d] for d in result)
    return torch.einsum(eq, *ins)


def as_matmul(a: torch.Tensor, b: torch.Tensor, adims: list[str], bdims: list[str],
               rdims: list[str]) -> torch.Tensor | None:
    """A linear layer's einsum as one matmul of views (what a framework's linear does: it keeps
    its input and weight, not permuted copies), or None when the dims are not in that order."""
    contracted = [d for d in adims if d in bdims and d not in rdims]
    a_free = [d for d in adims if d not in contracted]
    b_free = [d for d in bdims if d not in contracted]
    if not contracted or rdims != a_free + b_free or adims[len(a_free):] != contracted:
        return None
    k = math.prod(a.shape[len(a_free):])
    if bdims[:len(contracted)] == contracted:
        w = b.reshape(k, -1)
    elif bdims[len(b_free):] == contracted:
        w = b.reshape(-1, k).t()
    else:
        return None
    y = a.reshape(*a.shape[:len(a_free)], k) @ w
    return y.reshape(*a.shape[:len(a_free)], *[b.shape[bdims.index(d)] for d in b_free])


def elementwise(node: Node, ins: list[torch.Tensor], graph: Graph) -> torch.Tensor:
    """Inputs broadcast by name. ``scale`` multiplies by ``attrs.factor`` (1 when the graph does
    not record the number, as the tracer does not)."""
    try:
        return graph_ops.elementwise(str(node.attrs.get("fn")), ins, [graph_ops.dims_of(graph.node(i))
                                                                      for i in node.inputs],
                                     graph_ops.dims_of(node), float(node.attrs.get("factor", 1.0)))
    except StrategyError as e:
        raise StrategyError(f"{node.id}: {e}") from None


def causal_attention(node: Node, ins: list[torch.Tensor], q_offset: int, dropout: bool) -> torch.Tensor:
    """Causal attention of the local queries (rows ``q_offset ..``) over the whole key sequence,
    with PyTorch's fused kernel (no scores kept). Attention dropout is not applied: the fused CPU
    kernel has none (the other dropouts are)."""
    q, k, v = (t.transpose(1, 2) for t in ins)
    causal = bool(node.attrs.get("causal"))
    gqa = q.shape[1] != k.shape[1]
    if causal and (q_offset or q.shape[2] != k.shape[2]):
        rows = torch.arange(q.shape[2]).unsqueeze(1) + q_offset
        mask = torch.arange(k.shape[2]).unsqueeze(0) <= rows
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
    else:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    return out.transpose(1, 2)


class RMSNormFunction(torch.autograd.Function):
    """``x · rsqrt(mean(x²) + eps) · w`` keeping ``x`` and ``rstd`` (not ``x·rstd``) for backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, w, rstd)
        return x * rstd * w

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, w, rstd = ctx.saved_tensors
        normed = x * rstd
        gw = (grad * normed).sum(dim=tuple(range(grad.dim() - 1)))
        gn = grad * w
        gx = rstd * (gn - normed * (gn * normed).mean(-1, keepdim=True))
        return gx, gw, None


def embedding(ids: torch.Tensor, weight: torch.Tensor, row_offset: int, rows_total: int) -> torch.Tensor:
    """Rows of the local slice of the table (others are zero: partial sums over the vocabulary split)."""
    if weight.shape[0] == rows_total:
        return F.embedding(ids, weight)
    local = ids - row_offset
    inside = (local >= 0) & (local < weight.shape[0])
    return F.embedding(local.clamp(0, weight.shape[0] - 1), weight) * inside.unsqueeze(-1).to(weight.dtype)


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-token loss; the classes are the logits' last dim (the builder's and the tracer's order)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)

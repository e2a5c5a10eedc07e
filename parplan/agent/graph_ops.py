"""Operators of a traced graph on tensors whose dims are known by name.

A traced graph (:mod:`parplan.solver.frontends.torch_trace`) names every dim and lets an operator
read its inputs in any dim order: an elementwise op broadcasts by name, a ``reshape`` permutes and
regroups, a ``concat`` joins along a named dim, a ``reduce`` selects or averages over named dims,
and attention finds its head, query and key dims by name. These functions run such operators on
the local shards the plan interpreter (:mod:`parplan.agent.plan_interpreter`) hands them: sizes come from
the tensors (a split dim is smaller there), names and order from the graph.

Constant inputs the graph only declares (rotary tables, attention masks, shifted labels) are
synthesised by :func:`synthetic_input`: the same values in every process, so a plan's run and the
one-process reference compute the same function, which is all the comparison needs.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F  # noqa: N812 - PyTorch's convention

from parplan.solver.errors import StrategyError
from parplan.solver.ir import Node, attention_dims


def dims_of(node: Node) -> list[str]:
    return [d for d, _ in node.dims]


def align(t: torch.Tensor, dims: Sequence[str], out_dims: Sequence[str]) -> torch.Tensor:
    """``t`` (dims ``dims``) as a view in the order of ``out_dims``, with size-1 dims for the names
    it lacks (broadcasting by name)."""
    missing = [d for d in dims if d not in out_dims]
    if missing:
        raise StrategyError(f"cannot broadcast dims {list(dims)} to {list(out_dims)} (no {missing})")
    present = [d for d in out_dims if d in dims]
    t = t.permute(*[list(dims).index(d) for d in present])
    shape = [t.shape[present.index(d)] if d in present else 1 for d in out_dims]
    return t.reshape(shape) if len(shape) != t.dim() else t


def elementwise(fn: str, ins: Sequence[torch.Tensor], in_dims: Sequence[Sequence[str]],
                out_dims: Sequence[str], scale: float = 1.0) -> torch.Tensor:
    """One elementwise function of the IR, its inputs broadcast by name. ``scale`` multiplies by
    a number the graph does not record (the tracer drops it)."""
    xs = [align(t, d, out_dims) for t, d in zip(ins, in_dims, strict=True)]
    if fn == "add":
        return xs[0] + xs[1]
    if fn == "sub":
        return xs[0] - xs[1]
    if fn == "mul":
        return xs[0] * xs[1]
    if fn == "scale":
        return xs[0] * scale
    unary: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "gelu": F.gelu, "silu": F.silu, "relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
        "exp": torch.exp}
    if fn in unary and len(xs) == 1:
        return unary[fn](xs[0])
    raise StrategyError(f"elementwise function {fn!r} is not executed")


def reshape(x: torch.Tensor, src: Node, node: Node) -> torch.Tensor:
    """A ``reshape`` node: dims of the same name and size keep their (possibly split) extent and
    are permuted by name; the others are flattened in the input's order and regrouped in the
    output's (the tracer's row-major regrouping)."""
    src_sizes, out_sizes = dict(src.dims), dict(node.dims)
    sd, od = dims_of(src), dims_of(node)
    kept = [d for d in od if src_sizes.get(d) == out_sizes[d]]
    rest_in = [d for d in sd if d not in kept]
    rest_out = [d for d in od if d not in kept]
    t = x.permute(*[sd.index(d) for d in kept + rest_in])
    local = [t.shape[i] for i in range(len(kept))]
    if math.prod(src_sizes[d] for d in rest_in) != math.prod(out_sizes[d] for d in rest_out):
        raise StrategyError(f"{node.id}: cannot regroup {rest_in} as {rest_out}")
    t = t.reshape(*local, *[out_sizes[d] for d in rest_out])
    order = kept + rest_out
    return t.permute(*[order.index(d) for d in od])


def concat(ins: Sequence[torch.Tensor], srcs: Sequence[Node], node: Node) -> torch.Tensor:
    """A ``concat`` node: inputs joined along ``attrs.dim``, other dims broadcast by name."""
    cdim = str(node.attrs.get("dim"))
    od = dims_of(node)
    xs = [align(t, dims_of(s), od) for t, s in zip(ins, srcs, strict=True)]
    k = od.index(cdim)
    sizes = [max(x.shape[i] for x in xs) for i in range(len(od))]
    xs = [x.expand(*[x.shape[i] if i == k else sizes[i] for i in range(len(od))]) for x in xs]
    return torch.cat(xs, dim=k)


def reduce(x: torch.Tensor, src: Node, node: Node) -> torch.Tensor:
    """A ``reduce`` node: ``op=select`` takes entry ``attrs.index`` of the reduced dim; ``sum`` and
    ``mean`` reduce over ``attrs.over``. The remaining dims are put in the output's order."""
    sd = dims_of(src)
    over = [str(d) for d in node.attrs.get("over", [])]
    op = str(node.attrs.get("op", "sum"))
    if op == "select":
        if len(over) != 1:
            raise StrategyError(f"{node.id}: a select over {over}")
        y = x.select(sd.index(over[0]), int(node.attrs.get("index", 0)))
    elif op in ("sum", "mean"):
        axes = [sd.index(d) for d in over]
        y = x.sum(dim=axes) if op == "sum" else x.mean(dim=axes)
    else:
        raise StrategyError(f"{node.id}: reduction {op!r} is not executed")
    rest = [d for d in sd if d not in over]
    return y.permute(*[rest.index(d) for d in dims_of(node)]) if rest else y


def softmax(x: torch.Tensor, node: Node) -> torch.Tensor:
    return torch.softmax(x, dim=dims_of(node).index(str(node.attrs.get("dim"))))


def attention_by_name(node: Node, q_node: Node, k_node: Node, v_node: Node, ins: Sequence[torch.Tensor],
                      mask: torch.Tensor | None) -> torch.Tensor | None:
    """Scaled dot-product attention when k and v have the query's head dims by name (a traced
    graph's repeated key heads): q, k, v as ``[batch, heads, seq, head_dim]`` views or copies, one
    fused call with the (local rows of the) mask, the result in q's dim order. None when k's heads
    differ from q's (the builder's grouped-query layout; the caller runs that)."""
    head_dim, kv_seq = attention_dims(node, q_node, k_node)
    qd, kd, vd = dims_of(q_node), dims_of(k_node), dims_of(v_node)
    q_seq = kv_seq if kv_seq in qd else next((d for d in qd if "seq" in d), None)
    if q_seq is None:
        return None
    group = [d for d in qd if d not in (q_seq, head_dim)]
    if sorted(group) != sorted(d for d in kd if d not in (kv_seq, head_dim)) or sorted(kd) != sorted(vd):
        return None
    q, k, v = ins[:3]
    qp = q.permute(*[qd.index(d) for d in [*group, q_seq, head_dim]])
    kp = k.permute(*[kd.index(d) for d in [*group, kv_seq, head_dim]])
    vp = v.permute(*[vd.index(d) for d in [*group, kv_seq, head_dim]])
    lead = list(qp.shape[:len(group)])
    heads = math.prod(lead[1:]) if len(lead) > 1 else 1
    batch = lead[0] if lead else 1

    def four(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(batch, heads, t.shape[-2], t.shape[-1])

    scale = node.attrs.get("scale")
    out = F.scaled_dot_product_attention(four(qp), four(kp), four(vp), attn_mask=mask,
                                         is_causal=bool(node.attrs.get("causal")) and mask is None,
                                         scale=float(scale) if scale is not None else None)
    out = out.reshape(*lead, out.shape[-2], out.shape[-1])
    order = [*group, q_seq, head_dim]
    return out.permute(*[order.index(d) for d in qd])


def mask_for(mask: torch.Tensor, mask_node: Node, q_node: Node, q_offsets: dict[str, int],
             q_local: dict[str, int]) -> torch.Tensor:
    """The attention's mask input (q's batch and query-sequence dims, and one key dim q lacks) cut
    to the local queries (``q_offsets`` / ``q_local``: global offset and local size per q dim) and
    laid out as ``[batch or 1, 1, rows, keys]``."""
    md, qd = dims_of(mask_node), dims_of(q_node)
    keys = [d for d in md if d not in qd]
    rows = [d for d in md if d in qd and "seq" in d]
    batch = [d for d in md if d in qd and d not in rows]
    if len(keys) != 1 or len(rows) != 1 or len(batch) > 1:
        raise StrategyError(f"attention mask {mask_node.id} with dims {md} is not [batch, rows, keys]")
    t = mask
    for i, d in enumerate(md):
        if d in q_offsets and q_local[d] != t.shape[i]:
            t = t.narrow(i, q_offsets[d], q_local[d])
    order = batch + rows + keys
    t = t.permute(*[md.index(d) for d in order])
    return t.unsqueeze(1) if batch else t.unsqueeze(0).unsqueeze(0)


def synthetic_input(node: Node, vocab: int, seed: int) -> torch.Tensor:
    """Values of an input node the graph only declares, equal in every process: integer ids below
    ``vocab``; a boolean ``[..., rows, keys]`` mask of equal sizes as causal (key <= row), else all
    true; floating-point tables as uniform values in [-1, 1) seeded by the node's name."""
    shape = [s for _, s in node.dims]
    g = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(node.id.encode()))
    if node.dtype == "bool":
        if len(shape) >= 2 and shape[-1] == shape[-2]:
            causal = torch.ones(shape[-2], shape[-1], dtype=torch.bool).tril()
            return causal.expand(*shape).contiguous()
        return torch.ones(shape, dtype=torch.bool)
    if node.dtype.startswith("int"):
        return torch.randint(0, max(vocab, 1), shape, generator=g)
    return torch.rand(shape, generator=g) * 2 - 1

"""Mixture-of-experts ``dispatch`` and ``combine`` of the graph IR, with expert parallelism.

What the graph says (:mod:`parplan.solver.frontends.torch_trace.handlers_moe`): ``dispatch(x, probs)`` sends the
tokens ``x [tokens..., hidden]`` to ``[expert, capacity, hidden]`` by the router's probabilities
``probs [tokens..., expert]`` (``attrs.top_k`` experts per token); ``combine(y, probs)`` brings the
experts' outputs ``y [expert, capacity, hidden]`` back to the tokens. Executed here as:

- routing: each token picks its ``top_k`` most probable experts; an expert's ``capacity`` slots
  are filled in token order (tokens in row-major order of their dims), the tokens past its
  capacity are dropped for that expert (capacity-factor routing, as GShard and Switch do);
- ``dispatch``: slot ``(e, c)`` holds its token's features, empty slots are zero; no gradient
  reaches the probabilities through it;
- ``combine``: each token sums ``probs[token, e] · y[e, slot]`` over its kept slots (the router's
  probabilities unnormalised, as Qwen2-MoE's default ``norm_topk_prob=false``).

With expert parallelism (the operator's strategy splits ``expert`` over one mesh axis) the tokens
stay split by batch along that axis and the experts by contiguous blocks; each rank routes its own
tokens, learns the other ranks' per-expert counts (one all-gather of ``experts`` integers) to place
its tokens in the global slot order, and sends each kept token's features to the rank of its expert
with one ``all_to_all_single`` (variable splits); ``combine`` sends the rows back the same way. The
backward of each exchange is the reverse exchange. One process is the same code with one rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Routing:
    """One rank's routing of its tokens, for one expert group of ``ranks`` ranks.

    ``send_tokens`` / ``send_experts``: local token and expert of every kept (token, expert) pair,
    in the order they are sent (by expert, then slot); ``recv_slots``: flat slot ``local_expert ·
    capacity + slot`` of every row received, in the order received (by source rank, expert, slot).
    """

    send_tokens: torch.Tensor
    send_experts: torch.Tensor
    send_splits: list[int]
    recv_slots: torch.Tensor
    recv_splits: list[int]
    local_experts: int
    capacity: int


def route(probs: torch.Tensor, top_k: int, capacity: int, group: Any = None) -> Routing:
    """The routing of the local tokens ``probs [tokens, experts]`` (flattened token dims) within
    ``group`` (None: one process). Ranks of the group hold consecutive blocks of the tokens in rank
    order, and consecutive blocks of ``experts / ranks`` experts."""
    n = dist.get_world_size(group) if group is not None else 1
    me = dist.get_rank(group) if group is not None else 0
    experts = probs.shape[-1]
    if experts % n:
        raise ValueError(f"{experts} experts do not split over {n} ranks")
    per = experts // n
    chosen = torch.topk(probs.detach(), top_k, dim=-1).indices  # [tokens, k]
    picks = [torch.nonzero((chosen == e).any(-1)).flatten() for e in range(experts)]  # tokens, in order
    counts = torch.tensor([len(p) for p in picks], dtype=torch.int64)
    if group is not None:
        everyone = [torch.empty_like(counts) for _ in range(n)]
        dist.all_gather(everyone, counts, group=group)
        table = torch.stack(everyone)  # [ranks, experts]
    else:
        table = counts.unsqueeze(0)
    before = torch.cumsum(table, 0) - table  # slots the earlier ranks fill, per expert
    kept = torch.clamp(torch.minimum(table, capacity - before), min=0)  # [ranks, experts]
    send_tokens = torch.cat([picks[e][: int(kept[me, e])] for e in range(experts)])
    send_experts = torch.cat([torch.full((int(kept[me, e]),), e, dtype=torch.int64) for e in range(experts)])
    send_splits = [int(kept[me, d * per:(d + 1) * per].sum()) for d in range(n)]
    mine = range(me * per, (me + 1) * per)
    recv_slots = torch.cat([(e - me * per) * capacity + int(before[r, e]) + torch.arange(int(kept[r, e]))
                            for r in range(n) for e in mine])
    recv_splits = [int(kept[r, me * per:(me + 1) * per].sum()) for r in range(n)]
    return Routing(send_tokens, send_experts, send_splits, recv_slots.to(torch.int64), recv_splits, per, capacity)


class _Exchange(torch.autograd.Function):
    """Rows ``[n, hidden]`` sent in blocks of ``send`` rows per rank, received in blocks of ``recv``
    (``all_to_all_single``); the backward sends the gradients back the same way."""

    @staticmethod
    def forward(ctx: Any, rows: torch.Tensor, send: list[int], recv: list[int], group: Any) -> torch.Tensor:
        ctx.send, ctx.recv, ctx.group = send, recv, group
        out = rows.new_empty((sum(recv), *rows.shape[1:]))
        dist.all_to_all_single(out, rows.contiguous(), recv, send, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        out = grad.new_empty((sum(ctx.send), *grad.shape[1:]))
        dist.all_to_all_single(out, grad.contiguous(), ctx.send, ctx.recv, group=ctx.group)
        return out, None, None, None


def exchange(rows: torch.Tensor, send: list[int], recv: list[int], group: Any) -> torch.Tensor:
    """``rows`` through the all-to-all of a routing (themselves in one process)."""
    if group is None:
        return rows
    return _Exchange.apply(rows, send, recv, group)  # type: ignore[no-untyped-call, no-any-return]


def dispatch(x: torch.Tensor, r: Routing, group: Any) -> torch.Tensor:
    """Tokens ``x [tokens, hidden]`` to this rank's slots ``[local experts, capacity, hidden]``."""
    rows = exchange(x[r.send_tokens], r.send_splits, r.recv_splits, group)
    out = x.new_zeros((r.local_experts * r.capacity, x.shape[-1])).index_copy(0, r.recv_slots, rows)
    return out.view(r.local_experts, r.capacity, x.shape[-1])


def combine(y: torch.Tensor, probs: torch.Tensor, r: Routing, group: Any, tokens: int) -> torch.Tensor:
    """This rank's slots ``y [local experts, capacity, hidden]`` back to its ``tokens`` tokens, each
    the sum of its kept slots weighted by ``probs [tokens, experts]``."""
    rows = exchange(y.reshape(-1, y.shape[-1])[r.recv_slots], r.recv_splits, r.send_splits, group)
    weights = probs[r.send_tokens, r.send_experts].unsqueeze(-1)
    return rows.new_zeros((tokens, y.shape[-1])).index_add(0, r.send_tokens, rows * weights)

"""Shard(i) → Shard(j) along one mesh axis with a real all-to-all, where DTensor has none.

DTensor's ``redistribute`` turns a tensor split along dim ``i`` into one split along dim ``j``
with an all-to-all on NCCL; on gloo it falls back to an all-gather of the whole tensor and a
slice, which holds ``n`` times the memory a GPU run holds. The ILP prices the all-to-all (each
device exchanges its local part), so the agent's CPU runs would measure the fallback, not the
plan. gloo does have ``all_to_all_single``; this module performs the exchange with it, in
autograd (the backward is the reverse exchange), and hands back a DTensor in the new placements.
A change of several mesh axes is done one axis at a time when an order exists in which no later
mesh axis splits either dim of the swap being made (an earlier one may: its piece is what this
axis splits, as DTensor nests the splits of one dim in mesh order).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard


def exchange_axis(current: tuple[Any, ...], want: tuple[Any, ...]) -> tuple[int, int, int] | None:
    """(mesh axis, from dim, to dim) when ``current`` → ``want`` is one Shard(i) → Shard(j) swap
    that :func:`all_to_all_redistribute` can do; None otherwise."""
    diff = [k for k, (a, b) in enumerate(zip(current, want, strict=True)) if a != b]
    if len(diff) != 1:
        return None
    k = diff[0]
    a, b = current[k], want[k]
    if not (type(a) is Shard and type(b) is Shard):
        return None
    # another axis may split either dim only from outside this one (an earlier mesh axis): the local
    # part is then that axis's piece, which this axis splits further, as DTensor nests the splits
    inner = [p for m, p in enumerate(current) if m > k]
    if any(isinstance(p, Shard) and p.dim in (a.dim, b.dim) for p in inner):
        return None
    return k, a.dim, b.dim


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, src: int, dst: int) -> torch.Tensor:
        ctx.group, ctx.src, ctx.dst = group, src, dst
        return _exchange(x, group, src, dst)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return _exchange(grad.contiguous(), ctx.group, ctx.dst, ctx.src), None, None, None


def _exchange(x: torch.Tensor, group: Any, src: int, dst: int) -> torch.Tensor:
    """Local part split along ``src`` → local part split along ``dst``: chunk ``k`` of ``dst`` goes
    to rank ``k`` of the group; what arrives is stacked along ``src`` in rank order."""
    n = dist.get_world_size(group)
    # all_to_all_single sends block k of dim 0 to rank k: lay the dst-chunks one after another
    send = x.contiguous() if dst == 0 else torch.cat(x.chunk(n, dim=dst), dim=0)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    shape = list(x.shape)
    shape[dst] //= n
    return torch.cat(list(recv.view(n, *shape)), dim=src)


def swap_steps(current: tuple[Any, ...], want: tuple[Any, ...],
               ndim: int = 0) -> list[tuple[tuple[Any, ...], int, int, int]] | None:
    """A sequence of single-axis Shard(i) → Shard(j) swaps from ``current`` to ``want``, each as
    (placements after it, mesh axis, from dim, to dim) of :func:`exchange_axis`, or None when there
    is none: e.g. (S(vocab), S(batch)) → (S(batch), S(seq)) swaps the second axis first. When no
    axis can go straight to its target, one moves to a dim of the ``ndim`` no axis splits, which
    frees the way: (S(vocab), S(batch)) → (S(batch), S(batch)) goes through (S(vocab), S(seq))."""
    steps: list[tuple[tuple[Any, ...], int, int, int]] = []
    cur = tuple(current)
    while cur != tuple(want):
        if len(steps) > 2 * len(cur) + 2:
            return None
        found = _direct_step(cur, want)
        if found is None:
            found = _step_aside(cur, want, ndim)
        if found is None:
            return None
        steps.append(found)
        cur = found[0]
    return steps


def _direct_step(cur: tuple[Any, ...], want: tuple[Any, ...]) -> tuple[tuple[Any, ...], int, int, int] | None:
    for k in range(len(cur)):
        nxt = (*cur[:k], want[k], *cur[k + 1:])
        found = exchange_axis(cur, nxt) if cur[k] != want[k] else None
        if found is not None:
            return (nxt, *found)
    return None


def _step_aside(cur: tuple[Any, ...], want: tuple[Any, ...], ndim: int) -> tuple[tuple[Any, ...], int, int, int] | None:
    """One splitting axis (even one already where it should be: it may be in the others' way)
    moves to a dim nobody splits (now or in ``want``), if that is a swap :func:`exchange_axis`
    takes and after it some axis can go straight on."""
    used = {p.dim for p in (*cur, *want) if isinstance(p, Shard)}
    for k in reversed(range(len(cur))):  # inner axes first: they block the outer ones
        if not isinstance(cur[k], Shard):
            continue
        for f in range(ndim):
            if f in used:
                continue
            nxt = (*cur[:k], Shard(f), *cur[k + 1:])
            found = exchange_axis(cur, nxt)
            if found is not None and _direct_step(nxt, want) is not None:
                return (nxt, *found)
    return None


def all_to_all_redistribute(t: DTensor, want: list[Any]) -> DTensor | None:
    """``t`` in placements ``want`` through gloo's all-to-all, one mesh axis at a time, or None when
    the change is not a sequence of simple swaps (see :func:`swap_steps`)."""
    steps = swap_steps(tuple(t.placements), tuple(want), t.ndim)
    if not steps:
        return None
    for placements, axis, src, dst in steps:
        n = t.device_mesh.size(axis)
        if t.shape[dst] % n or t.shape[src] % n or t.to_local().shape[dst] % n:
            return None
        out = _AllToAll.apply(t.to_local(), t.device_mesh.get_group(axis), src, dst)  # type: ignore[no-untyped-call]
        t = DTensor.from_local(out, t.device_mesh, list(placements), run_check=False, shape=t.shape,
                               stride=t.stride())
    return t

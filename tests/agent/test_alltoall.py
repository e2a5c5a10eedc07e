"""Shard(i) -> Shard(j) through gloo's all-to-all (parplan.agent.alltoall), checked against
DTensor's own redistribute (its all-gather fallback on gloo) and, for the backward, against the
gradient of a weighted sum: both exact."""

from __future__ import annotations

from typing import Any

import pytest

from parplan.agent.launch import launch_function

CASES: list[tuple[tuple[int, ...], tuple[int, ...], list[tuple[str, int]], list[tuple[str, int]]]] = [
    ((4, 6, 8), (4,), [("S", 0)], [("S", 2)]),
    ((8, 4, 8), (4,), [("S", 2)], [("S", 0)]),
    ((4, 8, 2), (4,), [("S", 1)], [("S", 0)]),
    ((4, 8, 6), (2, 2), [("S", 0), ("S", 1)], [("S", 0), ("S", 2)]),
    ((4, 8, 6), (2, 2), [("R", 0), ("S", 1)], [("R", 0), ("S", 0)]),
    # both axes change (an ILP plan's logits, vocab x batch -> batch x seq): one axis at a time
    ((4, 8, 6), (2, 2), [("S", 2), ("S", 0)], [("S", 0), ("S", 1)]),
    # the inner axis moves to a dim the outer one splits already, and back (an ILP plan's embedding
    # sum, batch x hidden -> batch x batch)
    ((8, 4, 6), (2, 2), [("S", 0), ("S", 2)], [("S", 0), ("S", 0)]),
    ((8, 4, 6), (2, 2), [("S", 0), ("S", 0)], [("S", 0), ("S", 1)]),
    # no axis can go straight (an ILP plan's logits, vocab x batch -> batch x batch): the inner one
    # steps aside to a dim nobody splits first
    ((8, 4, 6), (2, 2), [("S", 2), ("S", 0)], [("S", 0), ("S", 0)]),
]


def _placements(spec: list[tuple[str, int]]) -> list[Any]:
    from torch.distributed.tensor import Replicate, Shard

    return [Shard(d) if kind == "S" else Replicate() for kind, d in spec]


def check_exchanges() -> list[bool]:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    from parplan.agent.alltoall import all_to_all_redistribute

    out = []
    for shape, mesh_shape, cur, want in CASES:
        mesh = init_device_mesh("cpu", mesh_shape)
        gen = torch.Generator().manual_seed(0)
        full, weight = torch.randn(*shape, generator=gen), torch.randn(*shape, generator=gen)
        t = distribute_tensor(full, mesh, _placements(cur)).requires_grad_()
        got = all_to_all_redistribute(t, _placements(want))
        ref = distribute_tensor(full, mesh, _placements(cur)).redistribute(mesh, _placements(want))
        ok = got is not None and torch.equal(got.to_local(), ref.to_local())
        if got is not None:
            (got.full_tensor() * weight).sum().backward()
            ok = ok and t.grad is not None and torch.equal(t.grad.full_tensor(), weight)
        out.append(bool(ok))
    return out


@pytest.mark.slow
def test_all_to_all_equals_dtensor_redistribute_forward_and_backward() -> None:
    results = launch_function(check_exchanges, (), nprocs=4)
    assert results == [[True] * len(CASES)] * 4


def test_only_one_axis_swapping_unshared_dims_is_taken() -> None:
    from torch.distributed.tensor import Partial, Replicate, Shard

    from parplan.agent.alltoall import exchange_axis

    assert exchange_axis((Shard(0),), (Shard(2),)) == (0, 0, 2)
    assert exchange_axis((Replicate(), Shard(1)), (Replicate(), Shard(0))) == (1, 1, 0)
    assert exchange_axis((Shard(0), Shard(1)), (Shard(1), Shard(0))) is None  # two axes change
    # dim 0 split by both axes: the inner axis can swap (it splits the outer one's piece), the outer cannot
    assert exchange_axis((Shard(0), Shard(1)), (Shard(0), Shard(0))) == (1, 1, 0)
    assert exchange_axis((Shard(1), Shard(0)), (Shard(0), Shard(0))) is None
    assert exchange_axis((Shard(0),), (Replicate(),)) is None  # a gather, not an exchange
    assert exchange_axis((Partial(),), (Shard(0),)) is None


def test_several_axes_are_swapped_one_at_a_time_in_an_order_that_exists() -> None:
    from torch.distributed.tensor import Replicate, Shard

    from parplan.agent.alltoall import swap_steps

    # the second axis must go first: the first one's target dim is split by the second until then
    assert swap_steps((Shard(2), Shard(0)), (Shard(0), Shard(1))) == [((Shard(2), Shard(1)), 1, 0, 1),
                                                                       ((Shard(0), Shard(1)), 0, 2, 0)]
    assert swap_steps((Shard(0), Shard(1)), (Shard(1), Shard(0))) is None  # each waits for the other
    # ... unless a third dim nobody splits lets one step aside
    assert swap_steps((Shard(2), Shard(0)), (Shard(0), Shard(0)), ndim=3) == [
        ((Shard(2), Shard(1)), 1, 0, 1), ((Shard(0), Shard(1)), 0, 2, 0), ((Shard(0), Shard(0)), 1, 1, 0)]
    assert swap_steps((Shard(0),), (Replicate(),)) is None
    assert swap_steps((Shard(0),), (Shard(0),)) == []

"""Alpha-beta collective costs against their closed forms."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from parplan.solver.cluster import DeviceMesh, Link, make_cluster
from parplan.solver.cost.collectives import (
    all_gather_seconds,
    all_reduce_seconds,
    all_to_all_seconds,
    p2p_seconds,
    reduce_scatter_seconds,
)
from parplan.solver.errors import ConfigError

ranks = st.integers(1, 4096)
sizes = st.floats(1.0, 1e12)
links = st.builds(Link, st.floats(1e8, 1e12), st.floats(0.0, 1e-4))

ONE_RING = [all_gather_seconds, reduce_scatter_seconds, all_to_all_seconds]


@given(ranks, sizes, links)
def test_all_reduce_closed_form(n: int, s: float, link: Link) -> None:
    b, lat = link.bandwidth_bytes_per_s, link.latency_seconds
    assert all_reduce_seconds(n, s, link) == pytest.approx(2 * (n - 1) / n * s / b + 2 * (n - 1) * lat)


@pytest.mark.parametrize("fn", ONE_RING)
@given(n=ranks, s=sizes, link=links)
def test_one_ring_closed_form(fn: object, n: int, s: float, link: Link) -> None:
    b, lat = link.bandwidth_bytes_per_s, link.latency_seconds
    assert fn(n, s, link) == pytest.approx((n - 1) / n * s / b + (n - 1) * lat)  # type: ignore[operator]


@given(sizes, links)
def test_p2p_closed_form(s: float, link: Link) -> None:
    assert p2p_seconds(s, link) == pytest.approx(s / link.bandwidth_bytes_per_s + link.latency_seconds)


@given(ranks, sizes, links)
def test_all_reduce_is_reduce_scatter_plus_all_gather(n: int, s: float, link: Link) -> None:
    assert all_reduce_seconds(n, s, link) == pytest.approx(
        reduce_scatter_seconds(n, s, link) + all_gather_seconds(n, s, link))


@pytest.mark.parametrize("fn", [all_reduce_seconds, *ONE_RING])
def test_single_rank_and_empty_buffer_are_free(fn: object) -> None:
    link = Link(100e9, 5e-6)
    assert fn(1, 1e9, link) == 0.0  # type: ignore[operator]
    assert fn(8, 0, link) == 0.0  # type: ignore[operator]
    assert p2p_seconds(0, link) == 0.0


def test_worked_example() -> None:
    # 1 GB all-reduce over 8 ranks at 100 GB/s, 10 µs: 2·7/8·10 ms + 14·10 µs = 17.64 ms.
    link = Link(100e9, 10e-6)
    assert all_reduce_seconds(8, 1e9, link) == pytest.approx(0.0175 + 0.00014)


@pytest.mark.parametrize(("n", "s"), [(0, 1.0), (-1, 1.0), (4, -1.0), (4, float("inf"))])
def test_bad_arguments(n: int, s: float) -> None:
    with pytest.raises(ConfigError):
        all_reduce_seconds(n, s, Link(1e9, 0.0))


def test_link_validation() -> None:
    with pytest.raises(ConfigError):
        Link(0, 1e-6)
    with pytest.raises(ConfigError):
        Link(1e9, -1e-6)


def test_data_parallel_traffic_per_zero_stage() -> None:
    """ZeRO 0: all-reduce the gradients; 1-2: reduce-scatter them and all-gather the updated
    weights; 3: reduce-scatter them, and all-gather the weights in each micro-batch's forward and
    backward (the updated weights stay sharded: no gather after the step); one rank: nothing.
    In DDP's 25 MiB buckets of gradients (each bucket's weights gathered in one collective): a whole
    number of buckets costs as many collectives of one bucket; any buffer costs the same split in
    parts (the latency is spread over the bytes). ``collectives`` given: that many per pass."""
    from parplan.solver.cost.collectives import DP_BUCKET_BYTES, data_parallel_seconds

    link = Link(100e9, 5e-6)
    g, w = 32 * DP_BUCKET_BYTES, 16 * DP_BUCKET_BYTES

    def ddp(grad_bytes: float) -> float:  # DDP's buckets the gradients make
        return grad_bytes / DP_BUCKET_BYTES

    assert data_parallel_seconds(4, g, w, 0, link, ddp(g)) == pytest.approx(
        (32 * all_reduce_seconds(4, DP_BUCKET_BYTES, link), 0.0, 0.0))
    ag = 32 * all_gather_seconds(4, w / 32, link)
    rs = 32 * reduce_scatter_seconds(4, DP_BUCKET_BYTES, link)
    zero2 = data_parallel_seconds(4, g, w, 2, link, ddp(g))
    assert zero2 == pytest.approx((rs, ag, 0.0))  # the weights' gather follows the optimizer step
    assert zero2.sync == pytest.approx(rs + ag)
    # ZeRO-3 keeps the updated weights sharded: no gather after the step, two in every micro-batch
    assert data_parallel_seconds(4, g, w, 3, link, ddp(g)) == pytest.approx((rs, 0.0, 2 * ag))
    assert data_parallel_seconds(1, g, w, 3, link, ddp(g)) == (0.0, 0.0, 0.0)
    # one collective per pass (a unit's, under FSDP)
    one = (reduce_scatter_seconds(4, g, link), 0.0, 2 * all_gather_seconds(4, w, link))
    assert data_parallel_seconds(4, g, w, 3, link, collectives=1.0) == pytest.approx(one)
    halves = [data_parallel_seconds(4, g / 2, w / 2, 3, link, collectives=0.5) for _ in range(2)]
    assert tuple(map(sum, zip(*halves, strict=True))) == pytest.approx(one)
    parts = [data_parallel_seconds(4, x, x / 2, 1, link, ddp(x)).sync for x in (1e5, 3e6, 7e7)]
    total = 1e5 + 3e6 + 7e7
    assert sum(parts) == pytest.approx(data_parallel_seconds(4, total, total / 2, 1, link, ddp(total)).sync)


@pytest.mark.parametrize(("gpus", "per_node", "shape"), [(16, 8, (2, 8)), (16, 8, (8, 2)), (32, 8, (16, 2)),
                                                          (32, 4, (4, 8)), (16, 8, (16,))])
def test_an_all_to_all_over_nodes_sends_its_remote_share_through_each_gpus_network_card(
        gpus: int, per_node: int, shape: tuple[int, ...]) -> None:
    """Over the outer axis of a mesh (row-major: its members sit ``gpus / (per_node)`` apart), an
    all-to-all's remote share goes through one GPU's network card while the ring collectives of
    the same group keep the ring's bandwidth (one ring per member of a node)."""
    cluster = make_cluster(gpus, per_node, "A100-80GB")
    mesh = DeviceMesh.of(cluster, [(f"m{i}", size) for i, size in enumerate(shape)])
    n = shape[0]
    inner = gpus // n  # devices between neighbours along m0
    m = max(1, per_node // inner)  # m0's members on one node
    nvlink, nic = cluster.intra_node, cluster.inter_node
    link = mesh.group_link(["m0"], cluster)
    s = 1e9
    local = (m - 1) / n * s / nvlink.bandwidth_bytes_per_s + (m - 1) * nvlink.latency_seconds
    remote = (n - m) / n * s / nic.bandwidth_bytes_per_s + (n - m) * nic.latency_seconds
    assert all_to_all_seconds(n, s, link) == pytest.approx(max(local, remote), rel=1e-12)
    ring = min(nvlink.bandwidth_bytes_per_s, m * nic.bandwidth_bytes_per_s)
    assert all_gather_seconds(n, s, link) == pytest.approx((n - 1) / n * s / ring + (n - 1) * link.latency_seconds,
                                                           rel=1e-12)

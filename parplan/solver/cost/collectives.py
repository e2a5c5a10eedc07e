"""Collective communication times under the α-β (latency-bandwidth) model of ring algorithms.

Notation: ``n`` ranks, a buffer of ``S`` bytes, a link of bandwidth ``B`` bytes/s (per direction,
per GPU) and latency ``L`` seconds (per ring step). Times are in seconds:

=================  ===============================  ==========================================
collective         time                             ``size_bytes`` is
=================  ===============================  ==========================================
all-reduce         ``2(n−1)/n·S/B + 2(n−1)·L``      the full buffer every rank holds (in = out)
reduce-scatter     ``(n−1)/n·S/B + (n−1)·L``        the full *input* of one rank (output S/n)
all-gather         ``(n−1)/n·S/B + (n−1)·L``        the full *output* of one rank (input S/n)
all-to-all         ``(n−1)/n·S/B + (n−1)·L``        the whole send buffer of one rank
point-to-point     ``S/B + L``                      the message
=================  ===============================  ==========================================

One rank (``n == 1``) or an empty buffer costs 0 seconds. The link is the slowest one the group
spans (see :meth:`parplan.solver.cluster.DeviceMesh.group_link`), except for an all-to-all over a
group that spans nodes, which the link's ``spread`` prices (:func:`spread_all_to_all_seconds`).
With this model all-reduce = reduce-scatter + all-gather of the same ``S`` exactly.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from parplan.solver.cluster import Link
from parplan.solver.errors import ConfigError


def _check(n: int, size_bytes: float) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"a collective needs n >= 1 ranks, got {n!r}")
    if not math.isfinite(size_bytes) or size_bytes < 0:
        raise ConfigError(f"a collective needs a finite size_bytes >= 0, got {size_bytes!r}")


def _ring(n: int, size_bytes: float, link: Link, passes: int) -> float:
    """``passes`` ring passes: each moves (n−1)/n·S per rank in n−1 steps."""
    _check(n, size_bytes)
    if n == 1 or size_bytes == 0:
        return 0.0
    steps = n - 1
    return passes * (steps / n * size_bytes / link.bandwidth_bytes_per_s + steps * link.latency_seconds)


def all_reduce_seconds(n: int, size_bytes: float, link: Link) -> float:
    """Seconds to all-reduce a buffer of ``size_bytes`` (the full buffer, held by every rank)."""
    return _ring(n, size_bytes, link, passes=2)


def reduce_scatter_seconds(n: int, size_bytes: float, link: Link) -> float:
    """Seconds to reduce-scatter: ``size_bytes`` is the full (unsharded) input of one rank."""
    return _ring(n, size_bytes, link, passes=1)


def all_gather_seconds(n: int, size_bytes: float, link: Link) -> float:
    """Seconds to all-gather: ``size_bytes`` is the full gathered output (n × one rank's shard)."""
    return _ring(n, size_bytes, link, passes=1)


def all_to_all_seconds(n: int, size_bytes: float, link: Link) -> float:
    """Seconds for an all-to-all: ``size_bytes`` is one rank's whole send buffer (it keeps 1/n).
    Over a group that spans nodes (``link.spread``, from :func:`~parplan.solver.cluster.ring_link`)
    each rank's remote share goes through its own network card: :func:`spread_all_to_all_seconds`."""
    if link.spread is not None:
        s = link.spread
        return spread_all_to_all_seconds(n, size_bytes, s.per_node, s.intra, s.inter)
    return _ring(n, size_bytes, link, passes=1)


def spread_all_to_all_seconds(n: int, size_bytes: float, per_node: int, intra: Link, inter: Link) -> float:
    """Seconds for an all-to-all over ``n`` ranks, ``per_node`` of them on each node: every rank
    sends ``(per_node−1)/n`` of its buffer to its node's peers over ``intra`` and ``(n−per_node)/n``
    to the other nodes' over its own share of the network (``inter``, per GPU), one message per peer;
    the two run at once and the slower decides. (A ring's bandwidth counts a node's every network
    card for each ring, which an all-to-all, whose ranks all send across at once, does not get.)
    Inside one node (``per_node == n``) this is the ring formula of :func:`all_to_all_seconds`."""
    _check(n, size_bytes)
    if n == 1 or size_bytes == 0:
        return 0.0
    per_node = max(1, min(per_node, n))
    local = (per_node - 1) / n * size_bytes / intra.bandwidth_bytes_per_s + (per_node - 1) * intra.latency_seconds
    remote = (n - per_node) / n * size_bytes / inter.bandwidth_bytes_per_s + (n - per_node) * inter.latency_seconds
    return max(local, remote)


def p2p_seconds(size_bytes: float, link: Link) -> float:
    """Seconds to send one message of ``size_bytes`` to one peer (a pipeline-stage hand-off)."""
    _check(1, size_bytes)
    if size_bytes == 0:
        return 0.0
    return size_bytes / link.bandwidth_bytes_per_s + link.latency_seconds


#: Gradient buckets of DDP (its default ``bucket_cap_mb``), bytes.
DP_BUCKET_BYTES = 25 * 2**20


def _passes(n: int, size_bytes: float, link: Link, passes: int, collectives: float) -> float:
    """``passes`` ring passes over ``size_bytes``, sent as ``collectives`` collectives per pass: the
    bandwidth term of the whole buffer and the latency of each collective (a fraction for a buffer
    that shares its collective with others, so the parameters of a step add up to the same
    whichever way they are grouped)."""
    _check(n, size_bytes)
    if collectives < 0 or not math.isfinite(collectives):
        raise ConfigError(f"collectives must be a finite number >= 0, got {collectives!r}")
    if n == 1 or size_bytes == 0:
        return 0.0
    steps = n - 1
    return passes * steps * (size_bytes / (n * link.bandwidth_bytes_per_s) + link.latency_seconds * collectives)


def weight_all_gather_seconds(n: int, weight_bytes: float, link: Link, collectives: float) -> float:
    """The all-gather of ``weight_bytes`` of weights (their whole size) over ``n`` ranks, sent as
    ``collectives`` collectives."""
    return 0.0 if n == 1 else _passes(n, weight_bytes, link, 1, collectives)


class DataParallelTraffic(NamedTuple):
    """Seconds of one group of parameters' data-parallel traffic, by when it runs: ``reduce`` the
    gradients' reduction once a step, ``weight_gather`` ZeRO 1-2's all-gather of the updated weights
    after the optimizer step, ``gathers`` one micro-batch's ZeRO-3 weight gathers (forward and
    backward)."""

    reduce: float
    weight_gather: float
    gathers: float

    @property
    def sync(self) -> float:
        """The once-per-step traffic: the reduction and the weight gather after the step."""
        return self.reduce + self.weight_gather


def data_parallel_seconds(n: int, grad_bytes: float, weight_bytes: float, zero: int,
                          link: Link, collectives: float) -> DataParallelTraffic:
    """The traffic of parameters replicated over ``n`` data-parallel ranks: an all-reduce of the
    gradients (ZeRO 0), a reduce-scatter and an all-gather of the updated weights (ZeRO 1-2), a
    reduce-scatter alone (ZeRO-3, whose weights stay sharded after the update); ZeRO-3 gathers the
    weights in every micro-batch's forward and backward. ``collectives``: how many collectives of
    each pass these parameters account for
    (:func:`parplan.solver.cost.rules.data_parallel_collectives`)."""
    if n == 1:
        return DataParallelTraffic(0.0, 0.0, 0.0)
    if zero == 0:
        return DataParallelTraffic(_passes(n, grad_bytes, link, 2, collectives), 0.0, 0.0)
    reduce = _passes(n, grad_bytes, link, 1, collectives)
    gather = weight_all_gather_seconds(n, weight_bytes, link, collectives)
    if zero >= 3:
        return DataParallelTraffic(reduce, 0.0, 2 * gather)
    return DataParallelTraffic(reduce, gather, 0.0)


def hybrid_data_parallel_seconds(shard: int, replicate: int, grad_bytes: float, weight_bytes: float, zero: int,
                                 shard_link: Link, replicate_link: Link, collectives: float) -> DataParallelTraffic:
    """Hybrid sharding's traffic: :func:`data_parallel_seconds` over the ``shard`` ranks of a shard
    group (the gradients reduce-scattered, the weights all-gathered there), then each rank's
    ``1 / shard`` of the reduced gradients all-reduced across the ``replicate`` groups, in the
    gradient reduction (FSDP2's HSDP, ``foreach_reduce``: reduce-scatter over the shard mesh axis,
    all-reduce over the replicate one; Megatron-LM's ``param_and_grad_buffer.py`` with
    ``--num-distributed-optimizer-instances``: the same, per bucket)."""
    within = data_parallel_seconds(shard, grad_bytes, weight_bytes, zero, shard_link, collectives)
    if replicate == 1:
        return within
    across = _passes(replicate, grad_bytes / shard, replicate_link, 2, collectives)
    return DataParallelTraffic(within.reduce + across, within.weight_gather, within.gathers)

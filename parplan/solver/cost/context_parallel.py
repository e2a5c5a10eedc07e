"""Attention under context parallelism (Megatron-LM's ``--context-parallel-size``): the p2p ring,
and the all-to-all (Ulysses) exchange (``--cp-comm-type p2p`` / ``a2a``).

With ``cp`` context-parallel ranks every activation holds ``1/cp`` of the tokens (the layouts of
:mod:`.unit_strategy` split the sequence over the ``cp`` axis). Attention needs every key and value
of the sequence.

*Ring* (``p2p``): each rank keeps its own key/value chunk and passes chunks round a ring,
computing attention of its queries against one chunk while the next arrives (cp steps, cp − 1
transfers). Megatron cuts the sequence into ``2·cp`` chunks and gives rank ``i`` chunks ``i`` and
``2·cp − 1 − i``, so every rank does ``1/cp`` of the causal attention's work.

- Memory: the chunk being computed on and the one arriving (double buffering) in forward; in
  backward the key/value chunks and the travelling key/value gradients, both double-buffered.
- Time: per step a chunk's transfer overlaps one step's share of the attention's compute; what the
  transfer takes beyond that share is exposed. Backward sends keys, values and their gradients.

*All-to-all* (``a2a``, DeepSpeed-Ulysses): before attention an all-to-all over the ``cp`` ranks
turns q, k and v from a sequence split into a head split (every rank: the whole sequence, ``1/cp``
of the heads), and one after it turns the output back; backward does the same with the gradients.
A rank holds as many bytes of q, k and v as before, so what is saved does not change.

- Memory: the re-laid copies of q, k and v beside the originals in forward; of the output's
  gradient and q's, k's and v's gradients in backward.
- Time: the four all-to-alls each way, not overlapped with compute.

Bytes per device; the chunk is what one rank holds of K and V (its key heads under TP).
"""

from __future__ import annotations

from dataclasses import dataclass

from parplan.solver.cluster import Link
from parplan.solver.cost.collectives import all_to_all_seconds, p2p_seconds

#: K/V chunks a rank holds at once beyond its own in forward (computing on one, receiving the next)
FORWARD_CHUNKS = 2
#: in backward: two K/V chunks and two chunks of their gradients travelling the ring
BACKWARD_CHUNKS = 4


def ring_buffer_bytes(kv_chunk_bytes: float, backward: bool) -> float:
    """Receive buffers of the ring while one attention runs (``kv_chunk_bytes``: K plus V of one rank)."""
    return (BACKWARD_CHUNKS if backward else FORWARD_CHUNKS) * kv_chunk_bytes


def all_to_all_buffer_bytes(q_bytes: float, kv_chunk_bytes: float, out_bytes: float, backward: bool) -> float:
    """Re-laid copies the all-to-all exchange holds while one attention runs: q, k and v in forward;
    the output's gradient and q's, k's and v's in backward (one rank's bytes of each)."""
    return q_bytes + kv_chunk_bytes + (out_bytes if backward else 0.0)


def all_to_all_exchange(cp: int, q_bytes: float, kv_chunk_bytes: float, out_bytes: float,
                        link: Link, recomputed: bool = False) -> CpExchange:
    """All-to-alls of q, k and v (head split) and of the output (sequence split back), forward (again
    when backward recomputes it) and of their gradients backward, none hidden."""
    if cp <= 1:
        return CpExchange(0.0, 0.0)
    one_pass = sum(all_to_all_seconds(cp, b, link) for b in (q_bytes, kv_chunk_bytes, out_bytes) if b)
    seconds = (3 if recomputed else 2) * one_pass
    return CpExchange(seconds, seconds)


@dataclass(frozen=True)
class AttentionBytes:
    """What one rank holds of an attention's q, of its k and v together, and of its output (bytes)."""

    q: float
    kv: float
    out: float


@dataclass(frozen=True)
class CpExchange:
    """Seconds of one attention's context-parallel exchange for one micro-batch."""

    traffic_seconds: float  # every transfer, forward and backward
    exposed_seconds: float  # what compute does not hide


def ring_exchange(cp: int, kv_chunk_bytes: float, forward_seconds: float, backward_seconds: float,
                  link: Link, recomputed: bool = False) -> CpExchange:
    """``cp − 1`` transfers of K and V in forward (again when backward recomputes the forward) and of
    K, V and their gradients in backward, each overlapped with ``1/cp`` of the attention's compute
    of that pass (``forward_seconds``, ``backward_seconds``: one rank's attention, already split)."""
    if cp <= 1:
        return CpExchange(0.0, 0.0)
    steps = cp - 1
    fwd = p2p_seconds(kv_chunk_bytes, link)
    bwd = p2p_seconds(2 * kv_chunk_bytes, link)
    passes = 2 if recomputed else 1
    exposed_f = max(0.0, fwd - forward_seconds / cp)
    exposed_b = max(0.0, bwd - backward_seconds / cp)
    return CpExchange(steps * (passes * fwd + bwd), steps * (passes * exposed_f + exposed_b))


def cp_buffer_bytes(comm: str, sizes: AttentionBytes, backward: bool) -> float:
    """The exchange's buffers while one attention runs forward or backward, by ``comm``."""
    if comm == "a2a":
        return all_to_all_buffer_bytes(sizes.q, sizes.kv, sizes.out, backward)
    return ring_buffer_bytes(sizes.kv, backward)


def cp_exchange(comm: str, cp: int, sizes: AttentionBytes, forward_seconds: float, backward_seconds: float,
                ring_link: Link, group_link: Link, recomputed: bool = False) -> CpExchange:
    """One attention's exchange by ``comm``: the ring over its slowest hop, or the all-to-alls over
    the context-parallel group's link."""
    if comm == "a2a":
        return all_to_all_exchange(cp, sizes.q, sizes.kv, sizes.out, group_link, recomputed)
    return ring_exchange(cp, sizes.kv, forward_seconds, backward_seconds, ring_link, recomputed)

"""Ring attention under context parallelism (Megatron-LM's ``--context-parallel-size``, p2p ring).

With ``cp`` context-parallel ranks every activation holds ``1/cp`` of the tokens (the layouts of
:mod:`.unit_strategy` split the sequence over the ``cp`` axis). Attention needs every key and value
of the sequence: each rank keeps its own key/value chunk and passes chunks round a ring, computing
attention of its queries against one chunk while the next arrives (cp steps, cp - 1 transfers).
Megatron cuts the sequence into ``2·cp`` chunks and gives rank ``i`` chunks ``i`` and
``2·cp − 1 − i``, so every rank does ``1/cp`` of the causal attention's work.

- Memory: the chunk being computed on and the one arriving (double buffering) in forward; in
  backward the key/value chunks and the travelling key/value gradients, both double-buffered.
- Time: per step a chunk's transfer overlaps one step's share of the attention's compute; what the
  transfer takes beyond that share is exposed. Backward sends keys, values and their gradients.

Bytes per device; the chunk is what one rank holds of K and V (its key heads under TP).
"""

from __future__ import annotations

from dataclasses import dataclass

from parplan.solver.cluster import Link
from parplan.solver.cost.collectives import p2p_seconds

#: K/V chunks a rank holds at once beyond its own in forward (computing on one, receiving the next)
FORWARD_CHUNKS = 2
#: in backward: two K/V chunks and two chunks of their gradients travelling the ring
BACKWARD_CHUNKS = 4


def ring_buffer_bytes(kv_chunk_bytes: float, backward: bool) -> float:
    """Receive buffers of the ring while one attention runs (``kv_chunk_bytes``: K plus V of one rank)."""
    return (BACKWARD_CHUNKS if backward else FORWARD_CHUNKS) * kv_chunk_bytes


@dataclass(frozen=True)
class RingExchange:
    """Seconds of one attention's ring exchange for one micro-batch."""

    traffic_seconds: float  # every transfer, forward and backward
    exposed_seconds: float  # what compute does not hide


def ring_exchange(cp: int, kv_chunk_bytes: float, forward_seconds: float, backward_seconds: float,
                  link: Link, recomputed: bool = False) -> RingExchange:
    """``cp − 1`` transfers of K and V in forward (again when backward recomputes the forward) and of
    K, V and their gradients in backward, each overlapped with ``1/cp`` of the attention's compute
    of that pass (``forward_seconds``, ``backward_seconds``: one rank's attention, already split)."""
    if cp <= 1:
        return RingExchange(0.0, 0.0)
    steps = cp - 1
    fwd = p2p_seconds(kv_chunk_bytes, link)
    bwd = p2p_seconds(2 * kv_chunk_bytes, link)
    passes = 2 if recomputed else 1
    exposed_f = max(0.0, fwd - forward_seconds / cp)
    exposed_b = max(0.0, bwd - backward_seconds / cp)
    return RingExchange(steps * (passes * fwd + bwd), steps * (passes * exposed_f + exposed_b))

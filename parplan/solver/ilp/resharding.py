"""Cost of converting a tensor from its producer's layout to the layout a consumer needs.

Per mesh axis, from the producer's state (split on a dim, partial sums, or replicated) to the
consumer's (split on a dim, or replicated), forward plus backward:

==========================  ================================  ==========================
producer → consumer         forward                           backward (its gradient)
==========================  ================================  ==========================
same                        nothing                           nothing
split d → replicated        all-gather                        slice (free)
replicated → split d        slice (free)                      all-gather
split d → split d'          all-to-all                        all-to-all
partial → replicated        all-reduce                        nothing
partial → split d           reduce-scatter                    all-gather
==========================  ================================  ==========================

Axes are converted one after the other; each collective moves the tensor's bytes as held with
that axis gathered (the other axes as the producer left them), over that axis's link. The
per-axis costs satisfy the triangle inequality (a direct conversion never costs more than one
through an intermediate layout), which is what lets zero-cost views follow their producer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from parplan.solver.cluster import Link
from parplan.solver.cost.collectives import (
    all_gather_seconds,
    all_reduce_seconds,
    all_to_all_seconds,
    reduce_scatter_seconds,
)
from parplan.solver.cost.layout import TensorLayout


def _axis_state(layout: TensorLayout, axis: str) -> str | None:
    """The dim ``axis`` splits, ``"#partial"``, or None (replicated)."""
    if axis in layout.partial:
        return "#partial"
    for d, axes in layout.split:
        if axis in axes:
            return d
    return None


def reshard_seconds(total_bytes: float, src: TensorLayout, dst: TensorLayout, mesh: Mapping[str, int],
                    links: Mapping[str, Link]) -> float:
    """Forward + backward seconds to turn ``src`` into ``dst`` (``total_bytes``: unsharded size)."""
    if src == dst:
        return 0.0
    seconds = 0.0
    for axis, n in mesh.items():
        if n == 1:
            continue
        a, b = _axis_state(src, axis), _axis_state(dst, axis)
        if a == b:
            continue
        others = math.prod(mesh[x] for x in src.axes if x != axis)
        nbytes = total_bytes / others
        link = links[axis]
        if a == "#partial":
            if b is None:
                seconds += all_reduce_seconds(n, nbytes, link)
            else:
                seconds += reduce_scatter_seconds(n, nbytes, link) + all_gather_seconds(n, nbytes, link)
        elif a is None or b is None:
            seconds += all_gather_seconds(n, nbytes, link)
        else:
            seconds += 2 * all_to_all_seconds(n, nbytes / n, link)
    return seconds


def reshard_buffer_bytes(total_bytes: float, src: TensorLayout, dst: TensorLayout, mesh: Mapping[str, int]) -> float:
    """Bytes of the new buffer a conversion materialises on each device: the tensor in the
    consumer's layout when some axis gathers (split → replicated) or exchanges (split → split');
    slicing and in-place reductions need none."""
    for axis, n in mesh.items():
        if n == 1:
            continue
        a, b = _axis_state(src, axis), _axis_state(dst, axis)
        if a not in (None, "#partial") and a != b:
            return total_bytes / dst.shards(mesh)
    return 0.0

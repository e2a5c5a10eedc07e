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

A consumer whose work is split over an axis that does not split the input (a column-parallel
linear reading a replicated input) leaves that input's gradient partial along the axis: backward
reduces it into the producer's layout, a reduce-scatter where the producer splits a dim over the
axis (sequence parallelism), an all-reduce where it does not (:func:`gradient_reduction_seconds`).
Several consumers of one tensor add their partial gradients first and reduce once, so each is
charged its share.

Axes are converted one after the other; each collective moves the tensor's bytes as held with
that axis gathered (the other axes as the producer left them), over that axis's link. The
per-axis costs satisfy the triangle inequality (a direct conversion never costs more than one
through an intermediate layout), which is what lets zero-cost views follow their producer.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping

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


def misordered_axes(src: TensorLayout, dst: TensorLayout) -> tuple[str, ...]:
    """Axes that split a dim in both layouts but at another place in the order of the axes dividing
    it (outer first), beyond the two orders' common beginning: a device's piece of a dim split over
    several axes is indexed by its coordinates in that order, so its piece under ``src`` is not a
    superset of its piece under ``dst`` there. Such an axis is gathered before the dim is split again
    (DTensor all-gathers it first, as a gloo run shows)."""
    want = dict(dst.split)
    out: list[str] = []
    for d, axes in src.split:
        other = want.get(d, ())
        k = 0
        while k < min(len(axes), len(other)) and axes[k] == other[k]:
            k += 1
        out.extend(a for a in axes[k:] if a in other)
    return tuple(out)


def _without(layout: TensorLayout, axes: Collection[str]) -> TensorLayout:
    """``layout`` with ``axes`` no longer splitting any dim (gathered)."""
    return TensorLayout(tuple((d, tuple(a for a in ax if a not in axes)) for d, ax in layout.split
                              if any(a not in axes for a in ax)), layout.partial)


def reshard_seconds(total_bytes: float, src: TensorLayout, dst: TensorLayout, mesh: Mapping[str, int],
                    links: Mapping[str, Link], axes: Collection[str] | None = None) -> float:
    """Forward + backward seconds to turn ``src`` into ``dst`` (``total_bytes``: unsharded size),
    the collectives over ``axes`` only when given. (A :func:`misordered_axes` axis is priced as if
    the pieces nested: its gather is not counted, so that meshes differing only in the order of
    their axes keep the same optima, which lets the search solve one of them.)"""
    if src == dst:
        return 0.0
    seconds = 0.0
    for axis, n in mesh.items():
        if n == 1 or (axes is not None and axis not in axes):
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


def gradient_reduction_seconds(total_bytes: float, src: TensorLayout, dst: TensorLayout, partial_axes: Iterable[str],
                               mesh: Mapping[str, int], links: Mapping[str, Link],
                               axes: Collection[str] | None = None) -> float:
    """Backward seconds to reduce a gradient that is partial over ``partial_axes`` (held in the
    consumer's layout ``dst``) into the producer's layout ``src``: per axis, a reduce-scatter when
    ``src`` splits a dim over it, else an all-reduce (``total_bytes``: the unsharded tensor)."""
    seconds = 0.0
    for axis in partial_axes:
        n = mesh[axis]
        if n == 1 or (axes is not None and axis not in axes):
            continue
        nbytes = total_bytes / math.prod(mesh[x] for x in dst.axes if x != axis)
        if _axis_state(src, axis) not in (None, "#partial"):
            seconds += reduce_scatter_seconds(n, nbytes, links[axis])
        else:
            seconds += all_reduce_seconds(n, nbytes, links[axis])
    return seconds


def reduced_layout(produced: TensorLayout, needed: TensorLayout) -> TensorLayout:
    """The layout a tensor of partial sums has once reduced for a consumer that needs ``needed``:
    split over a partial axis where the consumer splits (a reduce-scatter), else whole there."""
    split = {d: list(axes) for d, axes in produced.split}
    for d, axes in needed.split:
        for a in axes:
            if a in produced.partial:
                split.setdefault(d, []).append(a)
    return TensorLayout.of(split)


def conversion_buffer_bytes(total_bytes: float, src: TensorLayout, dst: TensorLayout, mesh: Mapping[str, int],
                            leading_dim: str) -> tuple[float, float]:
    """(bytes of the buffers converting ``src`` to ``dst`` makes on each device before the last one,
    bytes of the last one: the tensor as the consumer receives it), axis after axis in
    :func:`reshard_seconds`' order, as DTensor's redistribution makes them (functional collectives,
    which write new buffers): an all-reduce a buffer of the tensor as held, a reduce-scatter one of
    its share, an all-gather one of the gathered tensor and, gathering a dim other than the
    ``leading_dim`` (DTensor gathers along the first dim, then concatenates the pieces along the
    split one), its concatenation too; an all-to-all a buffer of the share and its rearrangement;
    a slice a copy of the share (a :func:`misordered_axes` axis is all-gathered first). All are alive
    together while the consumer runs: each holds the one before it until the redistribution returns.
    (0, 0) for a tensor received as produced."""
    made: list[float] = []
    current = {d: list(axes) for d, axes in src.split}

    def held() -> float:
        return total_bytes / math.prod(mesh[x] for axes in current.values() for x in axes)

    def gather(axis: str, dim: str) -> None:  # an all-gather, concatenated off the leading dim
        made.extend([held() * mesh[axis]] * (1 if dim == leading_dim else 2))
        current[dim].remove(axis)

    mis = misordered_axes(src, dst)
    for axis, n in mesh.items():  # gathered first
        if axis in mis and n > 1:
            gather(axis, str(_axis_state(src, axis)))
    src = _without(src, mis)
    for axis, n in mesh.items():
        a, b = _axis_state(src, axis), _axis_state(dst, axis)
        if n == 1 or a == b:
            continue
        if a == "#partial":
            made.append(held() if b is None else held() / n)
        elif a is None:
            made.append(held() / n)  # replicated -> split: a copy of the share
        elif b is None:
            gather(axis, a)
        else:
            made.extend([held(), held()])  # split -> split': all-to-all and rearrangement
            current[a].remove(axis)
        if b not in (None, "#partial"):
            current.setdefault(b, []).append(axis)
    if not made:
        return 0.0, 0.0
    return sum(made[:-1]), made[-1]


def gradient_conversion_buffer_bytes(total_bytes: float, produced: TensorLayout, needed: TensorLayout,
                                     partial_axes: Iterable[str], mesh: Mapping[str, int],
                                     leading_dim: str) -> tuple[float, float]:
    """:func:`conversion_buffer_bytes` of the backward of converting ``produced`` to ``needed``: the
    consumer's gradient of the tensor, in the consumer's layout and partial over ``partial_axes``,
    converted back to the producer's layout, as DTensor's redistribution does in backward (an axis
    the producer left partial comes back replicated, or stays partial where the gradient is)."""
    partial = frozenset(partial_axes)
    grad = TensorLayout(needed.split, tuple(a for a in mesh if a in partial))
    target = TensorLayout(produced.split, tuple(a for a in produced.partial if a in partial))
    return conversion_buffer_bytes(total_bytes, grad, target, mesh, leading_dim)


def edge_seconds(total_bytes: float, produced: TensorLayout, needed: TensorLayout, partial_axes: frozenset[str],
                 sizes: Mapping[str, int], links: Mapping[str, Link], axes: Collection[str] | None = None) -> float:
    """One micro-batch's forward + backward seconds of an edge: converting the tensor to the layout
    its consumer needs, and reducing the gradient it leaves partial (readers of one tensor share
    both: the costliest reader's is paid once); the collectives over ``axes`` only when given."""
    return (reshard_seconds(total_bytes, produced, needed, sizes, links, axes)
            + gradient_reduction_seconds(total_bytes, produced, needed, partial_axes, sizes, links, axes))

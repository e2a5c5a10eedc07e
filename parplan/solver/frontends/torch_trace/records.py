"""What pass 1 of the tracer produces: records (future IR nodes over atoms), traced tensor values,
dim references in attributes, and the nodes pass 2 emits before their dims are named."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from parplan.solver.ir import OpKind


@dataclass(frozen=True)
class DimRef:
    """An attribute naming the dim of one atom (``many``: the dims of several); resolved to
    names when the graph is emitted."""

    atoms: tuple[int, ...]
    many: bool = False


@dataclass
class Record:
    """One future IR node: its output atoms and its inputs as (record, atoms it is read as)."""

    kind: OpKind
    atoms: list[int]
    inputs: list[tuple[int, list[int]]]
    dtype: str
    path: str
    stem: str
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Value:
    """A traced tensor: atoms per torch axis (``[]`` for size 1), the record holding its data,
    and the atoms that only this broadcast view has (``expand``), which the record lacks."""

    axes: list[list[int]]
    rec: int
    dtype: str
    aux: bool  # not derived from parameters: inputs, buffers, constants, index tensors
    bcast: frozenset[int] = frozenset()
    deps: frozenset[str] = frozenset()  # user inputs an aux tensor derives from
    empty: bool = False  # has a zero-sized axis (never becomes a node)
    own: list[int] = field(default_factory=list)  # aux broadcast view: its own input record

    def like(self, axes: list[list[int]], dtype: str | None = None, bcast: frozenset[int] | None = None) -> Value:
        """A view of the same data with other axes."""
        return Value(axes, self.rec, dtype or self.dtype, self.aux, self.bcast if bcast is None else bcast,
                     self.deps, self.empty, self.own)


@dataclass
class PendingNode:
    """An emitted node whose dims are still atoms: (atom, size)."""

    id: str
    kind: OpKind
    inputs: list[str]
    dims: list[tuple[int, int]]
    dtype: str
    path: str
    attrs: dict[str, Any]
    layer: str | None = None


def flat(axes: Iterable[Iterable[int]]) -> list[int]:
    return [a for ax in axes for a in ax]


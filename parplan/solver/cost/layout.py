"""How a tensor is laid out on a device mesh: which mesh axes split which named dims."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class TensorLayout:
    """``split`` maps a dim name to the mesh axes dividing it (outer axis first); ``partial``
    lists axes over which each device holds a partial sum (a pending all-reduce).

    Alpa's notation: ``S0`` = split over axis 0, ``R`` = replicated, ``S01`` = split over both.
    """

    split: tuple[tuple[str, tuple[str, ...]], ...] = ()
    partial: tuple[str, ...] = ()

    @staticmethod
    def of(split: Mapping[str, Iterable[str]] | None = None, partial: Iterable[str] = ()) -> TensorLayout:
        items = tuple((d, tuple(a)) for d, a in (split or {}).items() if tuple(a))
        return TensorLayout(items, tuple(partial))

    @property
    def axes(self) -> frozenset[str]:
        """Every mesh axis that splits some dim."""
        return frozenset(a for _, axes in self.split for a in axes)

    def shards(self, mesh: Mapping[str, int], dims: Iterable[str] | None = None) -> int:
        """Number of pieces the tensor is cut into (only counting ``dims`` when given)."""
        keep = None if dims is None else set(dims)
        return math.prod(mesh[a] for d, axes in self.split if keep is None or d in keep for a in axes)

    def describe(self) -> str:
        """Compact text, e.g. ``heads:S(tp) seq:S(dp)`` or ``R``."""
        parts = [f"{d}:S({','.join(a)})" for d, a in self.split]
        if self.partial:
            parts.append(f"P({','.join(self.partial)})")
        return " ".join(parts) or "R"


REPLICATED = TensorLayout()

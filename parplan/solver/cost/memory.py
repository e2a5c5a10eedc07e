"""Per-device memory by category, and the redundant part of it.

The categories are ``parameters``, ``gradients``, ``optimizer_states``, ``activations`` and
``temporary``. A tensor cut into ``k`` pieces and replicated ``r`` times costs ``bytes / k`` per
device, of which ``(1 - 1/r)`` is *redundant* (held by other devices too); summed over the devices
that is exactly copies − unique bytes, the memory-redundancy paper's redundant memory. ZeRO
(Rajbhandari et al. 2020) over the data-parallel ranks: stage 1 shards optimizer states, stage 2
also gradients, stage 3 also parameters. The per-operator accounting is in
:mod:`parplan.solver.ilp.costs` and :mod:`parplan.solver.cost.units`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

CATEGORIES = ("parameters", "gradients", "optimizer_states", "activations", "temporary")


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes on one device, by category. ``temporary`` is a peak (buffers that do not coexist)."""

    parameters: float = 0.0
    gradients: float = 0.0
    optimizer_states: float = 0.0
    activations: float = 0.0
    temporary: float = 0.0

    @property
    def model_states(self) -> float:
        """Parameters + gradients + optimizer states, bytes."""
        return self.parameters + self.gradients + self.optimizer_states

    @property
    def total(self) -> float:
        """Peak bytes: every category at once (temporary already is a peak)."""
        return self.model_states + self.activations + self.temporary

    def __add__(self, other: MemoryBreakdown) -> MemoryBreakdown:
        # written out: the searches add breakdowns millions of times
        return MemoryBreakdown(self.parameters + other.parameters, self.gradients + other.gradients,
                               self.optimizer_states + other.optimizer_states, self.activations + other.activations,
                               self.temporary + other.temporary)

    def scaled(self, factor: float) -> MemoryBreakdown:
        return MemoryBreakdown(self.parameters * factor, self.gradients * factor, self.optimizer_states * factor,
                               self.activations * factor, self.temporary * factor)

    def replace(self, **changes: float) -> MemoryBreakdown:
        return MemoryBreakdown(**{**self.as_floats(), **changes})

    def as_floats(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def as_dict(self) -> dict[str, int]:
        """Whole bytes per category (JSON output)."""
        return {k: round(v) for k, v in self.as_floats().items()}


@dataclass(frozen=True)
class Memory:
    """Per-device bytes and the redundant part of them."""

    bytes: MemoryBreakdown
    redundant: MemoryBreakdown

    def __add__(self, other: Memory) -> Memory:
        return Memory(self.bytes + other.bytes, self.redundant + other.redundant)

"""The redundant-memory cost model: per-device bytes by category, and which bytes are redundant.

For a set of operators placed on one device group, given each tensor's :class:`TensorLayout`
on the device mesh, it returns the bytes one device holds in each category
(``parameters``, ``gradients``, ``optimizer_states``, ``activations``, ``temporary``) and the
part of them that is *redundant*: held by other devices too. A tensor cut into ``k`` pieces and
replicated ``r`` times costs ``bytes / k`` per device, of which ``(1 - 1/r)`` is redundant; summed
over the devices that is exactly (copies − unique bytes), the paper's redundant memory.

ZeRO over the data-parallel axes (Rajbhandari et al. 2020): stage 1 shards optimizer states,
stage 2 also gradients, stage 3 also parameters, each over the data axes that do not already
split the parameter.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields

from parplan.solver.cost.activations import Recompute, SavedItem
from parplan.solver.cost.layout import TensorLayout
from parplan.solver.cost.precision import Precision
from parplan.solver.ir import Node

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
        return MemoryBreakdown(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def scaled(self, factor: float) -> MemoryBreakdown:
        return MemoryBreakdown(*(getattr(self, f.name) * factor for f in fields(self)))

    def replace(self, **changes: float) -> MemoryBreakdown:
        return MemoryBreakdown(**{**self.as_floats(), **changes})

    def as_floats(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def as_dict(self) -> dict[str, int]:
        """Whole bytes per category (JSON output)."""
        return {k: round(v) for k, v in self.as_floats().items()}


@dataclass(frozen=True)
class MemoryContext:
    """What the memory of a placement depends on besides layouts.

    ``data_axes`` are the mesh axes over which the batch is divided (data parallelism); ZeRO
    shards over them. When ``per_replica_graph`` is true the graph was built for one data-parallel
    replica's micro-batch, so activations are never split (nor redundant) over the data axes.
    """

    mesh: Mapping[str, int]
    precision: Precision
    zero_stage: int = 0
    data_axes: tuple[str, ...] = ()
    recompute: Recompute = Recompute.SELECTIVE
    flash_attention: bool = True
    per_replica_graph: bool = True


@dataclass(frozen=True)
class Memory:
    """Per-device bytes and the redundant part of them."""

    bytes: MemoryBreakdown
    redundant: MemoryBreakdown

    def __add__(self, other: Memory) -> Memory:
        return Memory(self.bytes + other.bytes, self.redundant + other.redundant)


ZERO = Memory(MemoryBreakdown(), MemoryBreakdown())


def parameter_memory(param: Node, layout: TensorLayout, ctx: MemoryContext) -> Memory:
    """Weights, gradients and optimizer states one device holds for one parameter tensor."""
    mesh = ctx.mesh
    local = param.numel / layout.shards(mesh)
    zero_axes = [a for a in ctx.data_axes if a not in layout.axes]
    nz = math.prod(mesh[a] for a in zero_axes)
    rep = layout.replication(mesh)
    prec = ctx.precision
    per = {
        "parameters": (local * prec.param_bytes, ctx.zero_stage >= 3),
        "gradients": (local * prec.grad_bytes, ctx.zero_stage >= 2),
        "optimizer_states": (local * prec.optimizer_state_bytes, ctx.zero_stage >= 1),
    }
    held: dict[str, float] = {}
    redundant: dict[str, float] = {}
    for cat, (nbytes, sharded) in per.items():
        r = rep // nz if sharded else rep
        held[cat] = nbytes / nz if sharded else nbytes
        redundant[cat] = held[cat] * (1 - 1 / max(r, 1))
    return Memory(MemoryBreakdown(**held), MemoryBreakdown(**redundant))


def model_state_memory(params: Iterable[Node], layout_of: Callable[[Node], TensorLayout],
                       ctx: MemoryContext) -> Memory:
    """Sum of :func:`parameter_memory` over distinct parameters."""
    total = ZERO
    seen: set[str] = set()
    for p in params:
        if p.id not in seen:
            seen.add(p.id)
            total = total + parameter_memory(p, layout_of(p), ctx)
    return total


def activation_memory(items: Iterable[SavedItem], layout_of: Callable[[str], TensorLayout],
                      ctx: MemoryContext) -> tuple[float, float]:
    """(bytes, redundant bytes) one device keeps for backward, items deduplicated by key."""
    mesh = ctx.mesh
    seen: set[str] = set()
    held = redundant = 0.0
    skip = ctx.data_axes if ctx.per_replica_graph else ()
    for it in items:
        if it.key in seen:
            continue
        seen.add(it.key)
        lay = layout_of(it.owner)
        local = it.total_bytes / lay.shards(mesh, it.dims)
        rep = lay.replication(mesh, extra_axes=skip)
        held += local
        redundant += local * (1 - 1 / rep)
    return held, redundant

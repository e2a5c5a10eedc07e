"""Calibration: the efficiencies and measured links that turn datasheet peaks into predictions.

Matmuls and attention are priced by :mod:`parplan.solver.cost.kernels`: each GEMM at its GPU's
ceiling times its shape's tile, wave and K-fill factor, attention at its kernel's figure. The
default calibration (:data:`DEFAULT_CALIBRATION`) leaves those to the kernel model's per-GPU
figures; its matmul efficiencies (55 % of the 16-bit peak, 50 % for other dtypes) are used only
where the kernel model has none (a GPU or dtype without a figure; the FLOPs of operators other
than GEMMs and attention), and 80 % of the HBM bandwidth prices memory-bound work. A calibration
the validation agent measured (``source`` then names where; :attr:`Calibration.measured`)
replaces the GEMM ceilings with its own, and the links.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from parplan.solver.cluster import FLOAT_DTYPES, Cluster, Link
from parplan.solver.errors import ConfigError

#: Matmul efficiency (fraction of the dense peak) used for dtypes a calibration does not list.
FALLBACK_MATMUL_EFFICIENCY = 0.5

_DEFAULT_MATMUL_EFFICIENCY: Mapping[str, float] = MappingProxyType(
    {"bf16": 0.55, "fp16": 0.55, "fp32": 0.5, "tf32": 0.5, "fp8": 0.5})

_KEYS = ("matmul_efficiency", "memory_efficiency", "intra_node", "inter_node", "source")


def _fraction(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or not 0 < value <= 1:
        raise ConfigError(f"{what} must be in (0, 1], got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Calibration:
    """Efficiencies (fractions of peak) and optionally measured links of one hardware type.

    ``matmul_efficiency`` maps dtype → achieved fraction of the dense peak FLOP/s (a dtype not
    listed uses :data:`FALLBACK_MATMUL_EFFICIENCY`); ``memory_efficiency`` is the achieved
    fraction of HBM bandwidth; ``intra_node`` / ``inter_node``, when set, replace the preset's
    links. ``source`` is ``"default"`` or where and when the numbers were measured
    (``"agent:<hardware key>@<UTC time>"``).
    """

    matmul_efficiency: Mapping[str, float] = field(default_factory=lambda: _DEFAULT_MATMUL_EFFICIENCY)
    memory_efficiency: float = 0.8
    intra_node: Link | None = None
    inter_node: Link | None = None
    source: str = "default"

    def __post_init__(self) -> None:
        if not isinstance(self.matmul_efficiency, Mapping):
            raise ConfigError("calibration matmul_efficiency must map dtype -> fraction")
        eff: dict[str, float] = {}
        for dtype, value in self.matmul_efficiency.items():
            if dtype not in FLOAT_DTYPES:
                raise ConfigError(f"calibration matmul_efficiency: unknown dtype {dtype!r}; "
                                  f"known: {', '.join(FLOAT_DTYPES)}")
            eff[dtype] = _fraction(value, f"calibration matmul_efficiency[{dtype!r}]")
        object.__setattr__(self, "matmul_efficiency", MappingProxyType(eff))
        object.__setattr__(self, "memory_efficiency",
                           _fraction(self.memory_efficiency, "calibration memory_efficiency"))
        for what in ("intra_node", "inter_node"):
            if getattr(self, what) is not None and not isinstance(getattr(self, what), Link):
                raise ConfigError(f"calibration {what} must be a Link or None")
        if not isinstance(self.source, str) or not self.source:
            raise ConfigError("calibration source must be a non-empty string")

    def __hash__(self) -> int:
        return hash((tuple(sorted(self.matmul_efficiency.items())), self.memory_efficiency,
                     self.intra_node, self.inter_node, self.source))

    @property
    def measured(self) -> bool:
        """Whether the figures were measured on the hardware (anything but the default)."""
        return self.source != "default"

    def matmul_efficiency_for(self, dtype: str) -> float:
        """Fraction of the dense ``dtype`` peak that matmuls reach."""
        return self.matmul_efficiency.get(dtype, FALLBACK_MATMUL_EFFICIENCY)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict; :meth:`from_dict` reads it back to an equal calibration."""
        def link(x: Link | None) -> dict[str, float] | None:
            return None if x is None else {"bandwidth_bytes_per_s": x.bandwidth_bytes_per_s,
                                           "latency_seconds": x.latency_seconds}
        return {"matmul_efficiency": dict(self.matmul_efficiency),
                "memory_efficiency": self.memory_efficiency,
                "intra_node": link(self.intra_node), "inter_node": link(self.inter_node),
                "source": self.source}

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> Calibration:
        """Read :meth:`to_dict`'s form; missing keys take the defaults. ConfigError on bad values
        (efficiencies outside (0, 1], bandwidths <= 0, negative latencies, unknown keys)."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"a calibration must be an object, got {type(data).__name__}")
        unknown = sorted(set(data) - set(_KEYS))
        if unknown:
            raise ConfigError(f"unknown calibration keys {unknown}; known: {', '.join(_KEYS)}")

        def link(key: str) -> Link | None:
            raw = data.get(key)
            if raw is None:
                return None
            if not isinstance(raw, Mapping) or set(raw) != {"bandwidth_bytes_per_s", "latency_seconds"}:
                raise ConfigError(f"calibration {key} must be an object with bandwidth_bytes_per_s "
                                  f"and latency_seconds, got {raw!r}")
            try:
                return Link(bandwidth_bytes_per_s=raw["bandwidth_bytes_per_s"],
                            latency_seconds=raw["latency_seconds"])
            except ConfigError as e:
                raise ConfigError(f"calibration {key}: {e}") from None

        return Calibration(
            matmul_efficiency=data.get("matmul_efficiency", _DEFAULT_MATMUL_EFFICIENCY),
            memory_efficiency=data.get("memory_efficiency", 0.8),
            intra_node=link("intra_node"), inter_node=link("inter_node"),
            source=data.get("source", "default"))


#: Used when the service has no measurements for the hardware.
DEFAULT_CALIBRATION = Calibration()


def apply(cluster: Cluster, calibration: Calibration) -> Cluster:
    """``cluster`` with its links replaced by the calibration's measured ones, where it has them."""
    return replace(cluster,
                   intra_node_override=calibration.intra_node or cluster.intra_node_override,
                   inter_node_override=calibration.inter_node or cluster.inter_node_override)

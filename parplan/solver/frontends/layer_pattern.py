"""The repeating pattern of a transformers model's decoder layers, found on the model built on the
meta device, and the model cut down to the few layers that show the pattern.

A model of ``L`` layers is ``prefix`` irregular layers (DeepSeek-V3's dense layers before the MoE
ones) followed by a pattern of ``period`` layers (1 for Llama; 2 for Gemma-2's sliding / full
attention alternation; 6 for Gemma-3's), the last period possibly cut short. Layers are compared by a
structural signature: their modules' classes, parameter shapes and scalar attributes (the layer
index aside), and the layer's entry of every per-layer list of the config (``layer_types``).

:func:`cut_to_pattern` keeps the prefix and three periods (and as many layers again as the model's
cut-short last period), so that :mod:`parplan.solver.frontends.graph_repeat` can learn how node
ids advance from one period to the next on the first two and check it on the third.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

#: Periods of the pattern that are traced: one to learn the id shift from, one to check it on.
TRACED_PERIODS = 3
#: Attributes that number a layer rather than describe it.
_INDEX_ATTRS = frozenset({"layer_idx", "layer_id", "layer_number", "layer_index", "block_idx"})


@dataclass(frozen=True)
class LayerPattern:
    """Decoder layers ``path`` (a ``ModuleList``): ``layers`` in all, ``prefix`` irregular ones,
    then a pattern repeating every ``period`` layers; ``traced`` of them are traced."""

    path: str
    layers: int
    prefix: int
    period: int
    traced: int

    @property
    def extra_periods(self) -> int:
        """Periods the full model has beyond the traced ones."""
        return (self.layers - self.traced) // self.period

    @property
    def learn_from(self) -> int:
        """First layer of the period the id shift is learnt from (the next period is its image)."""
        return self.prefix

    @property
    def repeated(self) -> range:
        """Traced layers (a whole period) that are repeated to fill the full depth."""
        start = self.prefix + (TRACED_PERIODS - 1) * self.period
        return range(start, start + self.period)


def find_pattern(model: Any, config: Any) -> LayerPattern | None:
    """The pattern of ``model``'s decoder layers, or None when there is no layer list, no pattern, or
    the model is too shallow for tracing fewer layers to pay."""
    found = _layer_list(model, config)
    if found is None:
        return None
    path, layers = found
    n = len(layers)
    per_layer = _per_layer_config(config, n)
    sigs = [(_module_signature(layer), tuple(values[i] for values in per_layer)) for i, layer in enumerate(layers)]
    for period in range(1, n // (TRACED_PERIODS + 1) + 1):
        prefix = _first_periodic(sigs, period)
        if prefix is None:
            continue
        prefix = max(prefix, 1)  # layer 0's ops are the first of their names (no counter suffix)
        traced = prefix + TRACED_PERIODS * period + (n - prefix) % period
        if n - traced >= period:
            return LayerPattern(path, n, prefix, period, traced)
    return None


def cut_to_pattern(model: Any, config: Any, pattern: LayerPattern) -> None:
    """Keep only the first ``pattern.traced`` decoder layers of ``model`` (in place), and the
    matching entries of the config's per-layer lists."""
    parent_path, _, attr = pattern.path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    layers = getattr(parent, attr)
    setattr(parent, attr, type(layers)(list(layers)[: pattern.traced]))
    for key, value in list(vars(config).items()):
        if isinstance(value, list | tuple) and len(value) == pattern.layers and not key.startswith("_"):
            setattr(config, key, type(value)(value[: pattern.traced]))
    config.num_hidden_layers = pattern.traced


def _layer_list(model: Any, config: Any) -> tuple[str, Any] | None:
    """The ``ModuleList`` holding the config's ``num_hidden_layers`` layers (the largest such)."""
    n = getattr(config, "num_hidden_layers", None)
    if not isinstance(n, int) or n < 2:
        return None
    lists = [(path, m) for path, m in model.named_modules()
             if type(m).__name__ == "ModuleList" and len(m) == n]
    if not lists:
        return None
    return max(lists, key=lambda pm: sum(p.numel() for p in pm[1].parameters()))


def _per_layer_config(config: Any, n: int) -> list[tuple[Any, ...]]:
    """The config's lists with one entry per layer (``layer_types``, ...)."""
    return [tuple(v) for k, v in sorted(vars(config).items())
            if not k.startswith("_") and isinstance(v, list | tuple) and len(v) == n]


def _module_signature(layer: Any) -> tuple[Hashable, ...]:
    """Classes, parameter and buffer shapes and scalar attributes of a layer's modules."""
    out: list[Hashable] = []
    for name, sub in layer.named_modules():
        scalars = tuple(sorted((k, v) for k, v in vars(sub).items()
                               if not k.startswith("_") and k not in _INDEX_ATTRS
                               and isinstance(v, int | float | str | bool | type(None))))
        params = tuple((k, tuple(p.shape), str(p.dtype)) for k, p in sub.named_parameters(recurse=False))
        buffers = tuple((k, tuple(b.shape), str(b.dtype)) for k, b in sub.named_buffers(recurse=False))
        out.append((name, type(sub).__qualname__, scalars, params, buffers))
    return tuple(out)


def _first_periodic(sigs: list[Any], period: int) -> int | None:
    """The first layer from which ``sigs`` repeats every ``period`` layers, if enough periods follow
    it for tracing fewer layers to pay."""
    n = len(sigs)
    start = n - period
    while start > 0 and sigs[start - 1] == sigs[start - 1 + period]:
        start -= 1
    return start if n - start >= (TRACED_PERIODS + 1) * period else None

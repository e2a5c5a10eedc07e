"""The dispatch table of ATen operators, built from what the handler modules declare with
:func:`~.op.handles`; :data:`OP_TABLE` documents it (op -> the IR it maps to)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType, ModuleType

from parplan.solver.frontends.torch_trace import (
    handlers_linalg,
    handlers_moe,
    handlers_nn,
    handlers_pointwise,
    handlers_shape,
)
from parplan.solver.frontends.torch_trace.op import ATEN_OPS, Handler

#: The modules whose functions declare ATen operators.
HANDLER_MODULES: tuple[ModuleType, ...] = (handlers_linalg, handlers_pointwise, handlers_nn, handlers_shape,
                                           handlers_moe)


def collect(modules: Iterable[ModuleType]) -> tuple[dict[str, Handler], dict[str, str]]:
    """(op -> handler, op -> what it maps to) over the declared handlers of ``modules``; ValueError
    when two handlers declare one operator."""
    handlers: dict[str, Handler] = {}
    described: dict[str, str] = {}
    for module in modules:
        for fn in vars(module).values():
            for op, maps_to in getattr(fn, ATEN_OPS, {}).items():
                if handlers.setdefault(op, fn) is not fn:
                    raise ValueError(f"aten.{op} is declared by {handlers[op].__name__} and {fn.__name__}")
                described[op] = maps_to
    return handlers, described


_handlers, _described = collect(HANDLER_MODULES)
#: ATen operator (overload packet name, in-place ``_`` stripped) -> its handler.
HANDLERS: Mapping[str, Handler] = MappingProxyType(_handlers)
#: ATen operator -> the IR it maps to; any other operator on a computed tensor is refused.
OP_TABLE: Mapping[str, str] = MappingProxyType(_described)

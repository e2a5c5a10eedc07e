"""What an op handler is, and how it declares the ATen operators it maps (:func:`handles`).

A handler takes ``(recorder, fx node, arguments by schema name, op name)`` and returns the traced
value(s) of the node's output. :mod:`.table` collects the handlers into the dispatch table and
:data:`~.table.OP_TABLE` from what :func:`handles` attached to them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from parplan.solver.frontends.torch_trace.recorder import Recorder

Handler = Callable[[Recorder, Any, dict[str, Any], str], Any]

#: Attribute :func:`handles` sets on a handler: ``{aten op name: what it maps to}``.
ATEN_OPS = "aten_ops"


def handles(*ops: str, maps_to: str) -> Callable[[Handler], Handler]:
    """Declare that the decorated handler maps the ATen operators ``ops`` (overload packet names,
    in-place ``_`` stripped) to the IR described by ``maps_to``; stack it for several descriptions."""

    def mark(handler: Handler) -> Handler:
        declared: dict[str, str] = dict(getattr(handler, ATEN_OPS, {}))
        for op in ops:
            if op in declared:
                raise ValueError(f"{handler.__name__} declares aten.{op} twice")
            declared[op] = maps_to
        setattr(handler, ATEN_OPS, declared)
        return handler

    return mark


def out_shape(t: Recorder, node: Any) -> tuple[list[int], str]:
    """The node's output shape and IR dtype."""
    meta = node.meta.get("val")
    return [int(s) for s in meta.shape], t.ir_dtype(meta.dtype)

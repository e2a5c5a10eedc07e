"""Op handlers: views (no node, or a reshape when axes cannot be regrouped), concatenation, and
slicing (reshape + ``reduce(op=select)``, or nothing when the slice is the whole axis)."""

from __future__ import annotations

import itertools
from typing import Any

from parplan.solver.frontends.torch_trace.constants import ALIAS, EXPAND, PERMUTE, REGROUP
from parplan.solver.frontends.torch_trace.op import handles, out_shape
from parplan.solver.frontends.torch_trace.recorder import Recorder
from parplan.solver.frontends.torch_trace.records import Value, flat
from parplan.solver.ir import OpKind


@handles(*sorted(REGROUP), maps_to="view")
@handles(*sorted(PERMUTE), maps_to="view")
@handles(*sorted(EXPAND), maps_to="broadcast view")
@handles(*sorted(ALIAS), maps_to="alias")
def map_view(t: Recorder, node: Any, args: dict[str, Any], op: str) -> Value:
    x = args.get("self", args.get("input"))
    assert isinstance(x, Value)
    shape, dtype = out_shape(t, node)
    v = t.view(op, args, x, node.meta["val"])
    if v is not None:
        return v
    axes = [[t.A.new(s)] if s > 1 else [] for s in shape]  # axes that cannot be regrouped: new ones
    return Value(axes, t.record(OpKind.RESHAPE, flat(axes), [t.input_slot(x)], dtype), dtype, False)


@handles('cat', maps_to='concat')
@handles('stack', maps_to='reshape + concat')
def map_cat(t: Recorder, node: Any, args: dict[str, Any], op: str) -> Value:
    shape, dtype = out_shape(t, node)
    vals = [v for v in args["tensors"] if isinstance(v, Value) and not v.empty]
    if not vals:
        raise t.error(f"{op} of empty tensors")
    return t.concat(vals, int(args.get("dim", 0)) % len(shape), dtype, stack=op == "stack")


@handles('split', 'split_with_sizes', 'unsafe_split', 'chunk', 'unbind', 'slice', 'narrow', maps_to='select')
def map_split(t: Recorder, node: Any, args: dict[str, Any], op: str) -> Any:
    x = args.get("self", args.get("input"))
    assert isinstance(x, Value)
    dim = int(args.get("dim", 0)) % len(x.axes)
    if op == "unbind":
        return [t.select(x, dim, i, x.dtype, f"{i}") for i in range(len(node.meta["val"]))]
    total = t.size_of(x.axes[dim])
    if op in ("slice", "narrow"):
        if op == "slice":
            step = int(args.get("step") or 1)
            start = 0 if args.get("start") is None else int(args["start"])
            end = total if args.get("end") is None else int(args["end"])
            start, end = (start + total if start < 0 else start), (end + total if end < 0 else end)
            start, end = max(0, min(start, total)), max(0, min(end, total))
        else:
            step, start = 1, int(args["start"]) % total
            end = start + int(args["length"])
        if step != 1:
            if total % step or start >= step or -(-(end - start) // step) != total // step:
                raise t.error(f"unsupported operator aten.{op}: a strided slice of {start}:{end}:{step} over "
                              f"{total} elements is not representable")
            return t.strided(x, dim, step, start, x.dtype)
        return t.ranges(x, dim, [(start, end)], refine=False)[0]
    bounds = [0]
    for m in node.meta["val"]:
        bounds.append(bounds[-1] + int(m.shape[dim]))
    return t.ranges(x, dim, list(itertools.pairwise(bounds)), refine=True)


@handles('select', maps_to='select')
def map_select(t: Recorder, node: Any, args: dict[str, Any], op: str) -> Value:
    x = args["self"]
    dim = int(args["dim"]) % len(x.axes)
    return t.select(x, dim, int(args["index"]) % t.size_of(x.axes[dim]), out_shape(t, node)[1], None)

"""Op handlers: contractions (``linear``, matrix products, ``einsum``) as einsum nodes."""

from __future__ import annotations

from typing import Any

from parplan.solver.frontends.torch_trace.op import handles, out_shape
from parplan.solver.frontends.torch_trace.recorder import Recorder
from parplan.solver.frontends.torch_trace.records import Value


@handles('linear', maps_to='einsum (+ elementwise add for the bias)')
def map_linear(t: Recorder, node: Any, args: dict[str, Any], op: str) -> Value:
    x, w, b = args["input"], args["weight"], args.get("bias")
    _, dtype = out_shape(t, node)
    batch = [f"b{i}" for i in range(len(x.axes) - 1)]
    wl, out = (["n", "k"], [*batch, "n"]) if len(w.axes) == 2 else (["k"], batch)
    y = t.contract([(x, [*batch, "k"]), (w, wl)], out, dtype, "mm" if isinstance(b, Value) else None)
    return t.elementwise([y, b], "add", "add", dtype) if isinstance(b, Value) else y


def _mm_letters(n1: int, n2: int) -> tuple[list[str], list[str], list[str]]:
    """torch.matmul's broadcasting as einsum letters."""
    if n1 == 1 and n2 == 1:
        return ["k"], ["k"], []
    nb = max(n1, n2, 2) - 2
    batch = [f"b{i}" for i in range(nb)]
    a = ["k"] if n1 == 1 else [*batch[nb - (n1 - 2):], "m", "k"]
    b = ["k"] if n2 == 1 else [*batch[nb - (n2 - 2):], "k", "n"]
    return a, b, [*batch, *([] if n1 == 1 else ["m"]), *([] if n2 == 1 else ["n"])]


@handles('addmm', 'baddbmm', maps_to='einsum + elementwise add')
@handles('mm', 'bmm', 'matmul', maps_to='einsum')
def map_matmul(t: Recorder, node: Any, args: dict[str, Any], op: str) -> Value:
    _, dtype = out_shape(t, node)
    bias = args["self"] if op in ("addmm", "baddbmm") else None
    if op == "addmm":
        a, b = args["mat1"], args["mat2"]
    elif op == "baddbmm":
        a, b = args["batch1"], args["batch2"]
    else:
        a, b = args["self"], args.get("mat2", args.get("other"))
    la, lb, lo = _mm_letters(len(a.axes), len(b.axes))
    y = t.contract([(a, la), (b, lb)], lo, dtype, "mm" if bias is not None else None)
    return t.elementwise([y, bias], "add", "add", dtype) if isinstance(bias, Value) else y


@handles('einsum', maps_to='einsum')
def map_einsum(t: Recorder, node: Any, args: dict[str, Any], op: str) -> Value:
    eq = str(args["equation"]).replace(" ", "")
    tensors = args["tensors"]
    lhs, arrow, rhs = eq.partition("->")
    specs = lhs.split(",")
    if "." in eq or len(specs) != len(tensors):
        raise t.error(f"einsum equation {eq!r} (ellipsis or operand count) is not supported")
    if not arrow:
        rhs = "".join(sorted(c for c in set(lhs) - {","} if lhs.count(c) == 1))
    return t.contract([(v, list(s)) for v, s in zip(tensors, specs, strict=True)], list(rhs), out_shape(t, node)[1])

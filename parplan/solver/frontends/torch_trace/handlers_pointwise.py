"""Op handlers: pointwise ops, dropout, softmax and norms."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from parplan.solver.frontends.torch_trace.constants import P_FFN
from parplan.solver.frontends.torch_trace.op import handles, out_shape
from parplan.solver.frontends.torch_trace.recorder import Recorder
from parplan.solver.frontends.torch_trace.records import DimRef, Value, flat
from parplan.solver.ir import OpKind

_EW_FNS: Mapping[str, tuple[str, str]] = {
    "add": ("add", "add"), "sub": ("sub", "sub"), "rsub": ("sub", "sub"), "mul": ("mul", "scale"),
    "div": ("mul", "scale"), "neg": ("scale", "scale"), "square": ("mul", "mul"), "gelu": ("gelu", "gelu"),
    "silu": ("silu", "silu"), "relu": ("relu", "relu"), "tanh": ("tanh", "tanh"),
    "sigmoid": ("sigmoid", "sigmoid"), "exp": ("exp", "exp"),
}


@handles('add', maps_to='elementwise add')
@handles('sub', 'rsub', maps_to='elementwise sub')
@handles('mul', 'div', maps_to='elementwise mul (scale when by a scalar)')
@handles('neg', maps_to='elementwise scale')
@handles('square', maps_to='elementwise mul')
@handles('gelu', maps_to='elementwise gelu')
@handles('silu', maps_to='elementwise silu')
@handles('relu', maps_to='elementwise relu')
@handles('tanh', maps_to='elementwise tanh')
@handles('sigmoid', maps_to='elementwise sigmoid')
@handles('exp', maps_to='elementwise exp')
def map_pointwise(t: Recorder, node: Any, args: dict[str, Any], op: str) -> Value:
    fn_t, fn_s = _EW_FNS[op]
    operands: list[Any] = [args["self"]]
    if op in ("add", "sub", "rsub", "mul", "div"):
        operands.append(args.get("other"))
        if op == "div" and args.get("rounding_mode") is not None:
            raise t.error("div with a rounding_mode is not a mapped elementwise op")
    y = t.elementwise(operands, fn_t, fn_s, out_shape(t, node)[1])
    if op in ("gelu", "silu", "relu") and y.axes:
        t.hint(y.axes[-1], "ffn", P_FFN)
    return y


@handles('pow', maps_to='elementwise mul (integer exponent 2 or 3)')
def map_pow(t: Recorder, node: Any, args: dict[str, Any], op: str) -> Value:
    x, e = args.get("self"), args.get("exponent")
    if not isinstance(x, Value) or isinstance(e, Value) or e not in (1, 2, 3):
        raise t.error("unsupported operator aten.pow (only a tensor to the power 2 or 3 maps, to mul)")
    return x if e == 1 else t.elementwise([x], "mul", "mul", out_shape(t, node)[1])


@handles('dropout', 'feature_dropout', 'alpha_dropout', maps_to='dropout')
def map_dropout(t: Recorder, node: Any, args: dict[str, Any], op: str) -> Value:
    x = args["input"]
    p, train = float(args.get("p") or 0.0), bool(args.get("train", True))
    _, dtype = out_shape(t, node)
    if not train or p <= 0:
        return x.like([list(a) for a in x.axes], dtype)  # type: ignore[no-any-return]
    rec = t.record(OpKind.DROPOUT, flat(x.axes), [t.input_slot(x)], dtype, p=p)
    return Value([list(a) for a in x.axes], rec, dtype, False)


@handles('softmax', '_softmax', 'log_softmax', '_log_softmax', maps_to='softmax')
def map_softmax(t: Recorder, node: Any, args: dict[str, Any], op: str) -> Value:
    x = args["self"]
    _, dtype = out_shape(t, node)
    d, exp = t.single_dim(x, int(args["dim"]) % max(len(x.axes), 1))
    attrs: dict[str, Any] = {"dim": DimRef((d,))}
    if "log" in op:
        attrs["log"] = True
    rec = t.record(OpKind.SOFTMAX, exp, [t.input_slot(x, exp)], dtype, **attrs)
    return Value([list(a) for a in x.axes], rec, dtype, False)


@handles('layer_norm', maps_to='layernorm')
@handles('rms_norm', maps_to='rmsnorm')
def map_norm(t: Recorder, node: Any, args: dict[str, Any], op: str) -> Value:
    kind = OpKind.LAYERNORM if op == "layer_norm" else OpKind.RMSNORM
    w, b, eps = args.get("weight"), args.get("bias"), args.get("eps")
    return t.norm(kind, args["input"], len(args["normalized_shape"]), w if isinstance(w, Value) else None,
                  b if isinstance(b, Value) else None, out_shape(t, node)[1],
                   **({"eps": float(eps)} if eps is not None else {}))

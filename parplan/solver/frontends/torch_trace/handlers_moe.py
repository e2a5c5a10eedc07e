"""Op handlers and module mapping for mixture-of-experts routing.

A routed-experts module (its own parameters are 3-D ``[experts, ., .]`` weights, optionally 2-D
``[experts, .]`` biases; transformers' ``MixtralExperts``, ``Qwen2MoeExperts``, ...) is mapped as
a whole, the way the builder writes Mixtral: ``dispatch`` of the tokens to ``[expert, capacity,
hidden]`` by the router's probabilities, the expert MLP as einsums over the ``expert`` dim (a fused
``gate_up`` weight is split in two; gated when the input projections are twice the down
projection's width), and ``combine`` back to the tokens. The capacity is ``ceil(tokens · top_k /
experts)`` (a capacity factor of 1: the tokens' average load, as the builder's default), so the
expert FLOPs are ``top_k`` times the dense MLP's per token, as the real dropless kernels do.

``topk`` on activations maps its values to the first ``k`` entries of the axis (a select: the same
shape, no FLOPs; the router's top-k weights are folded into ``combine``) and its indices to an
index input; the probabilities it ranks are kept as the router of the next experts call.
"""

from __future__ import annotations

import math
from typing import Any

from parplan.solver.frontends.torch_trace.constants import ACT_NAMES, FLOAT
from parplan.solver.frontends.torch_trace.op import handles
from parplan.solver.frontends.torch_trace.recorder import Recorder
from parplan.solver.frontends.torch_trace.records import Value
from parplan.solver.ir import OpKind

#: Name-hint priority of the ``expert`` and ``capacity`` dims (the cost model reads ``expert``).
_P_EXPERT = 5
#: Priority of naming the tokens' features ``hidden`` (a norm's or embedding's name wins).
_P_HIDDEN = 13


def is_experts_module(mod: Any) -> bool:
    """Whether ``mod`` holds routed experts' weights only: 3-D ``[E, ., .]`` (and 2-D ``[E, .]``
    biases), with no parameters in submodules."""
    own = dict(mod.named_parameters(recurse=False))
    if not own or sum(1 for _ in mod.parameters()) != len(own):
        return False
    dims = [p.dim() for p in own.values()]
    leading = {int(p.shape[0]) for p in own.values()}
    return dims.count(3) >= 2 and set(dims) <= {2, 3} and len(leading) == 1 and next(iter(leading)) > 1


@handles("topk", maps_to="select (values) + index input (indices)")
def map_topk(t: Recorder, node: Any, args: dict[str, Any], op: str) -> list[Any]:
    """``topk`` of activations: (values as a select of ``k`` entries, indices as an index input)."""
    x = args["self"]
    assert isinstance(x, Value)
    k = int(args["k"])
    dim = int(args.get("dim", -1)) % len(x.axes)
    values_meta, indices_meta = node.meta["val"]
    values = t.ranges(x, dim, [(0, k)], refine=False)[0]
    values = values.like([list(a) for a in values.axes], t.ir_dtype(values_meta.dtype))
    indices = t.leaf(OpKind.INPUT, f"{t.node_path}.{node.name}.indices" if t.node_path else f"{node.name}.indices",
                     [int(s) for s in indices_meta.shape], t.ir_dtype(indices_meta.dtype), path=t.node_path, aux=True,
                      attrs={"index": True})
    if dim == len(x.axes) - 1:
        t.router = (x, k)
    return [values, indices]


@handles("gather", maps_to="select (as many entries along the dim as the index holds)")
def map_gather(t: Recorder, node: Any, args: dict[str, Any], op: str) -> Any:
    """``gather`` of activations along ``dim`` by an index tensor of the input's shape but fewer
    entries there (a router's top-k weights): a select of as many entries (same shape and bytes;
    which entries is data)."""
    x, index = args["self"], args["index"]
    assert isinstance(x, Value)
    dim = int(args["dim"]) % len(x.axes)
    shape = [int(s) for s in node.meta["val"].shape]
    if not isinstance(index, Value) or not index.aux or len(shape) != len(x.axes) \
            or any(shape[i] != t.size_of(a) for i, a in enumerate(x.axes) if i != dim):
        raise t.error("unsupported operator aten.gather: only a gather along one dim of an index of the input's "
                      "other sizes maps")
    out = t.ranges(x, dim, [(0, shape[dim])], refine=False)[0]
    return out.like([list(a) for a in out.axes], t.ir_dtype(node.meta["val"].dtype))


@handles("masked_fill", maps_to="elementwise mul by the mask (a mask not derived from parameters)")
def map_masked_fill(t: Recorder, node: Any, args: dict[str, Any], op: str) -> Any:
    """``masked_fill`` of activations by a mask not derived from parameters (a router's group
    mask): an elementwise ``mul`` by the mask (the same bytes and FLOPs)."""
    x, mask = args["self"], args["mask"]
    if not isinstance(x, Value) or not isinstance(mask, Value) or not mask.aux or isinstance(args.get("value"), Value):
        raise t.error("unsupported operator aten.masked_fill: only a mask computed from inputs or indices maps")
    return t.elementwise([x, mask], "mul", "mul", t.ir_dtype(node.meta["val"].dtype))


def collapse_experts(t: Recorder, path: str, mod: Any, main: Any, vals: list[tuple[Any, Any]],
                     env: dict[Any, Any]) -> bool:
    """Map one call of the experts module ``mod`` (output node ``main``) as dispatch, expert MLP and
    combine; False (map its ops one by one) when it does not look like a routed call."""
    mval = main.meta.get("val")
    if t.router is None or not hasattr(mval, "shape"):
        return False
    shape = [int(s) for s in mval.shape]
    xs = [v for _, v in vals if isinstance(v, Value) and not t.is_param(v) and v.dtype in FLOAT and not v.empty
          and [t.size_of(a) for a in v.axes] == shape]
    probs, top_k = t.router
    weights = dict(mod.named_parameters(recurse=False))
    n_exp = int(next(iter(weights.values())).shape[0])
    if len(xs) != 1 or len(shape) < 2 or t.size_of(probs.axes[-1]) != n_exp \
            or [t.size_of(a) for a in probs.axes[:-1]] != shape[:-1]:
        return False
    x = xs[0]
    t.set_where(main)
    t.node_path = path
    dtype = t.ir_dtype(mval.dtype)
    hidden = shape[-1]
    downs = [n for n, p in weights.items() if p.dim() == 3 and ("down" in n or "w2" in n)]
    ins = [n for n, p in weights.items() if p.dim() == 3 and n not in downs]
    if len(downs) != 1 or not 1 <= len(ins) <= 2:
        return False
    pv = {n: t.param_vals[t.canonical_name(p)] for n, p in weights.items()}
    for i in range(len(shape) - 1):  # the router's tokens are the experts' tokens
        t.A.unify(probs.axes[i], x.axes[i])
    e, exp_p = t.single_dim(probs, len(probs.axes) - 1)
    t.A.hint(e, "expert", _P_EXPERT)
    tokens = math.prod(shape[:-1])
    cap = t.A.new(math.ceil(tokens * top_k / n_exp))
    t.A.hint(cap, "capacity", _P_EXPERT)
    t.hint(x.axes[-1], "hidden", _P_HIDDEN)
    probs_in = t.input_slot(probs, exp_p)
    xe_atoms = [e, cap, *x.axes[-1]]
    xe_rec = t.record(OpKind.DISPATCH, xe_atoms, [t.input_slot(x), probs_in], x.dtype, "dispatch", top_k=top_k,
                      capacity_factor=1.0)
    xe = Value([[e], [cap], list(x.axes[-1])], xe_rec, x.dtype, False)

    def project(h: Value, name: str, width_in: int) -> Value:
        """``h [E, C, width_in]`` through weight ``name`` (``[E, out, in]`` as nn.Linear, else
        ``[E, in, out]``), plus its ``<name>_bias`` / ``<name>.bias`` when the module has one."""
        w = pv[name]
        sizes = [t.size_of(a) for a in w.axes]
        letters = ["e", "o", "i"] if sizes[2] == width_in else ["e", "i", "o"]
        if width_in not in sizes[1:]:
            raise t.error(f"expert weight {name} {sizes} has no axis of {width_in}")
        y = t.contract([(h, ["e", "c", "i"]), (w, letters)], ["e", "c", "o"], dtype, name)
        bias = next((pv[b] for b in (f"{name}_bias", f"{name}.bias") if b in pv), None)
        if bias is None:
            return y
        per_slot = bias.like([list(bias.axes[0]), [], list(bias.axes[1])])  # [E, 1, out]: one bias per expert
        return t.elementwise([y, per_slot], "add", "add", dtype, f"{name}.bias")

    down_w = [t.size_of(a) for a in pv[downs[0]].axes]
    ffn = down_w[2] if down_w[1] == hidden else down_w[1]
    act = next((fn for key, fn in ACT_NAMES for m in mod.modules() if key in type(m).__name__.lower()), "silu")
    outs = [project(xe, n, hidden) for n in ins]
    widths = [t.size_of(o.axes[-1]) for o in outs]
    if len(outs) == 1 and widths[0] == 2 * ffn:  # a fused gate_up weight
        gate, up = t.ranges(outs[0], 2, [(0, ffn), (ffn, 2 * ffn)], refine=True)
        h = t.elementwise([t.elementwise([gate], act, act, dtype, "act"), up], "mul", "mul", dtype, "mul")
    elif len(outs) == 2 and widths == [ffn, ffn]:  # separate gate and up weights
        h = t.elementwise([t.elementwise([outs[0]], act, act, dtype, "act"), outs[1]], "mul", "mul", dtype, "mul")
    elif len(outs) == 1 and widths[0] == ffn:  # not gated
        h = t.elementwise([outs[0]], act, act, dtype, "act")
    else:
        return False
    t.hint(h.axes[-1], "ffn", 30)
    y = project(h, downs[0], ffn)
    t.A.unify(y.axes[-1], x.axes[-1])
    out_axes = [list(a) for a in x.axes]
    rec = t.record(OpKind.COMBINE, [a for ax in out_axes for a in ax], [t.input_slot(y), probs_in], dtype, "combine")
    env[main] = Value(out_axes, rec, dtype, False)
    t.router = None
    return True

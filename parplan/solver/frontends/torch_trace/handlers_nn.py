"""Op handlers: embeddings, attention, losses and reductions."""

from __future__ import annotations

from typing import Any

from parplan.solver.frontends.torch_trace.constants import P_ATTN, P_CLASS, P_EMBED, P_NORM
from parplan.solver.frontends.torch_trace.op import handles, out_shape
from parplan.solver.frontends.torch_trace.recorder import Recorder
from parplan.solver.frontends.torch_trace.records import DimRef, Value, flat
from parplan.solver.ir import OpKind


@handles('embedding', maps_to='embedding')
def map_embedding(t: Recorder, node: Any, args: dict[str, Any], op: str) -> Value:
    w, ids = args["weight"], args["indices"]
    _, dtype = out_shape(t, node)
    v, exp_w = t.single_dim(w, 0)
    where = t.node_path.rpartition(".")[2].lower()
    if "type" in where or any("type" in d for d in ids.deps):
        t.hint([v], "types", P_EMBED + 1)
    elif "pos" in where or not ids.deps:
        t.hint([v], "positions", P_EMBED + 1)
    elif not t.vocab_named:
        t.hint([v], "vocab", P_EMBED)
        t.vocab_named = True
    for ax in w.axes[1:]:
        t.hint(ax, "hidden", P_NORM)
    out = [list(a) for a in ids.axes] + [list(a) for a in w.axes[1:]]
    rec = t.record(OpKind.EMBEDDING, flat(out), [t.input_slot(ids), t.input_slot(w, exp_w)], dtype,
                   index_dim=DimRef((v,)))
    return Value(out, rec, dtype, False)


@handles('scaled_dot_product_attention', maps_to='attention')
def map_sdpa(t: Recorder, node: Any, args: dict[str, Any], op: str) -> Value:
    q, k, v, mask = args["query"], args["key"], args["value"], args.get("attn_mask")
    _, dtype = out_shape(t, node)
    if min(len(q.axes), len(k.axes), len(v.axes)) < 2:
        raise t.error("scaled_dot_product_attention needs inputs of rank >= 2")
    if t.size_of(q.axes[-1]) != t.size_of(k.axes[-1]):
        raise t.error("attention whose key head size differs from the query's is not representable")
    # multi-head latent attention (DeepSeek-V2/V3): values narrower than the queries and keys
    v_own = t.size_of(q.axes[-1]) != t.size_of(v.axes[-1])
    qa, ka, va = ([list(a) for a in x.axes] for x in (q, k, v))

    def tie(dst: list[list[int]], i: int, src: list[int]) -> None:
        if dst[i] and src and t.size_of(src) == t.size_of(dst[i]) and not t.A.unify(src, dst[i]):
            dst[i] = src

    tie(ka, -1, qa[-1])
    if not v_own:
        tie(va, -1, qa[-1])
    tie(va, -2, ka[-2])
    for j in range(3, max(len(qa), len(ka), len(va)) + 1):
        if j <= len(qa) and j <= len(ka):
            tie(ka, -j, qa[-j])
        if j <= len(ka) and j <= len(va):
            tie(va, -j, ka[-j])
    t.hint(qa[-1], "head_dim", P_ATTN)
    t.hint(qa[-2], "seq", P_ATTN)
    if t.A.leaves(qa[-2]) != t.A.leaves(ka[-2]):
        t.hint(ka[-2], "kv_seq", P_ATTN)
    if len(qa) >= 3:
        hq = t.A.leaves(qa[-3])
        hk = t.A.leaves(ka[-3]) if len(ka) >= 3 else []
        if len(hq) == 1:
            t.A.hint(hq[0], "heads", P_ATTN)
        elif len(hq) == 2:  # grouped-query heads after repeat_kv: [kv_heads, q_per_kv]
            t.A.hint(hq[0], "kv_heads", P_ATTN)
            t.A.hint(hq[1], "q_per_kv", P_ATTN)
        if len(hk) == 1 and hk != hq:
            t.A.hint(hk[0], "kv_heads", P_ATTN)
    if len(qa) >= 4:
        t.hint(qa[-4], "batch", P_ATTN)
    out_axes = [*(list(a) for a in qa[:-1]), list(va[-1] if v_own else qa[-1])]
    hd, _ = t.single_dim(q.like(qa), len(qa) - 1)
    kv, _ = t.single_dim(k.like(ka), len(ka) - 2)
    if t.A.leaves(qa[-1]) != [hd]:  # a head dim split elsewhere: read q, k, v with it whole
        qa[-1], ka[-1] = [hd], [hd]
        va[-1] = va[-1] if v_own else [hd]
    if v_own:  # the value's head dim: one dim of its own, the output's last
        vd, _ = t.single_dim(v.like(va), len(va) - 1)
        va[-1] = [vd]
        t.hint(va[-1], "v_head_dim", P_ATTN)
    if t.A.leaves(ka[-2]) != [kv]:
        ka[-2], va[-2] = [kv], [kv]
    ins = [t.input_slot(q, flat(qa)), t.input_slot(k, flat(ka)), t.input_slot(v, flat(va))]
    if isinstance(mask, Value):
        ma = [list(a) for a in mask.axes]
        scores = [*qa[:-1], ka[-2]]
        for j in range(min(len(ma), len(scores)), 0, -1):  # batch, heads, seq before kv_seq
            if ma[-j] and t.size_of(ma[-j]) == t.size_of(scores[-j]):
                t.A.unify(scores[-j], ma[-j])
        if len(ma) >= 2 and ma[-1] and t.A.leaves(ma[-1]) != t.A.leaves(ka[-2]):
            t.hint(ma[-1], "kv_seq", P_ATTN + 1)
        ins.append(t.input_slot(mask, flat(ma)))
    attrs: dict[str, Any] = {"causal": bool(args.get("is_causal")), "dropout": float(args.get("dropout_p") or 0.0),
                             "head_dim": DimRef((hd,)), "kv_seq_dim": DimRef((kv,))}
    if args.get("scale") is not None:
        attrs["scale"] = float(args["scale"])
    rec = t.record(OpKind.ATTENTION, flat([*qa[:-1], va[-1] if v_own else qa[-1]]), ins, dtype, **attrs)
    return Value(out_axes, rec, dtype, False)


@handles('cross_entropy_loss', 'nll_loss', 'nll_loss_nd', maps_to='cross_entropy (+ reduce)')
def map_loss(t: Recorder, node: Any, args: dict[str, Any], op: str) -> Value:
    x, target = args["self"], args["target"]
    cls = 1 if len(x.axes) >= 2 else 0
    c, exp_x = t.single_dim(x, cls)
    t.hint([c], "vocab", P_CLASS)
    xa = [list(a) for i, a in enumerate(x.axes) if i != cls]
    ta = [list(a) for a in target.axes]
    if [t.size_of(a) for a in xa] != [t.size_of(a) for a in ta]:
        raise t.error(f"{op}: the labels' shape does not match the logits'")
    for i in range(len(ta)):
        if xa[i] and not t.A.unify(xa[i], ta[i]):
            ta[i] = xa[i]
    attrs: dict[str, Any] = {"class_dim": DimRef((c,)), "ignore_index": int(args.get("ignore_index", -100))}
    if args.get("label_smoothing"):
        attrs["label_smoothing"] = float(args["label_smoothing"])
    if op != "cross_entropy_loss":
        attrs["log_probs_input"] = True
    reduction = int(args.get("reduction", 1))
    rec = t.record(OpKind.CROSS_ENTROPY, flat(xa), [t.input_slot(x, exp_x), t.input_slot(target, flat(ta))], "fp32",
                   "tokens" if reduction and flat(xa) else None, **attrs)
    if reduction == 0 or not flat(xa):
        return Value(xa, rec, "fp32", False)
    red = t.record(OpKind.REDUCE, [], [(rec, flat(xa))], "fp32", over=DimRef(tuple(flat(xa)), many=True),
                   op="mean" if reduction == 1 else "sum")
    return Value([], red, "fp32", False)


@handles('mean', 'sum', maps_to='reduce')
def map_reduce(t: Recorder, node: Any, args: dict[str, Any], op: str) -> Value:
    x = args["self"]
    dims, n = args.get("dim"), len(x.axes)
    which = set(range(n)) if not dims else {int(d) % max(n, 1) for d in dims}
    keepdim = bool(args.get("keepdim", False))
    red = flat(x.axes[i] for i in sorted(which))
    out = [([] if i in which else list(a)) for i, a in enumerate(x.axes) if keepdim or i not in which]
    _, dtype = out_shape(t, node)
    if not red:
        return x.like(out, dtype)  # type: ignore[no-any-return]
    rec = t.record(OpKind.REDUCE, flat(out), [t.input_slot(x)], dtype, over=DimRef(tuple(red), many=True), op=op)
    return Value(out, rec, dtype, False)

"""Build the operator graph of a transformer from a :class:`TransformerConfig`.

The graph is built for one micro-batch (``batch`` samples of ``seq_len`` tokens). Node ids are
``<block>.<op>``; every node carries a ``layer`` tag: ``embed`` for what runs before the first
block, ``layers.<i>`` (``encoder.<i>`` / ``decoder.<i>`` for T5), ``encoder.final`` for T5's
encoder norm, and ``head`` for the final norm, LM head and loss. ``meta["units"]`` lists the tags
in execution order, which is what pipeline partitioning cuts.

Dim names used: ``batch seq hidden heads kv_heads head_dim ffn vocab positions types expert
capacity classes patch_dim buckets kv_seq tgt_seq``. The attention core is one ``attention`` node
(scaled dot-product attention); whether it is computed by a flash kernel is a training setting
the cost model applies, not a property of the graph.
"""

from __future__ import annotations

import math
from typing import Any

from parplan.solver.errors import ConfigError
from parplan.solver.frontends.config import DECODER_FAMILIES, TransformerConfig
from parplan.solver.ir import Graph, Node, OpKind, make_node

DimMap = dict[str, int]


class _Builder:
    """Appends nodes and remembers each node's dims so blocks can be written compactly."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.dims: dict[str, DimMap] = {}
        self.units: list[str] = []
        self.layer = "embed"

    def unit(self, tag: str) -> None:
        self.layer = tag
        self.units.append(tag)

    def add(self, nid: str, kind: OpKind, inputs: list[str], dims: DimMap, dtype: str = "bf16",
            **attrs: Any) -> str:
        self.nodes.append(make_node(nid, kind, inputs, dims, dtype=dtype, layer=self.layer, **attrs))
        self.dims[nid] = dict(dims)
        return nid

    def param(self, nid: str, dims: DimMap) -> str:
        return self.add(nid, OpKind.PARAMETER, [], dims)

    def input(self, nid: str, dims: DimMap, dtype: str = "int64") -> str:
        return self.add(nid, OpKind.INPUT, [], dims, dtype=dtype)

    def linear(self, nid: str, x: str, contract: list[str], out: DimMap, *, bias: bool,
               weight: str | None = None, group: str | None = None) -> str:
        """``x @ W (+ b)``: contracts the dims ``contract`` of x against a new (or given) weight.
        ``group``: a name the matmuls of one input that a trainer may run as one GEMM, their weights
        side by side, share (``gemm_group``, :func:`~parplan.solver.cost.kernels.gemm_group`)."""
        xd = self.dims[x]
        w = weight or self.param(f"{nid}.weight", {**{c: xd[c] for c in contract}, **out})
        wd = self.dims[w]
        keep = {k: v for k, v in xd.items() if k not in contract}
        res = {**keep, **{k: v for k, v in wd.items() if k not in contract}}
        eq = f"{' '.join(xd)}, {' '.join(wd)} -> {' '.join(res)}"
        attrs = {"gemm_group": group} if group else {}
        y = self.add(f"{nid}.mm" if bias else nid, OpKind.EINSUM, [x, w], res, equation=eq, **attrs)
        if not bias:
            return y
        b = self.param(f"{nid}.bias", out)
        return self.add(nid, OpKind.ELEMENTWISE, [y, b], res, fn="add")

    def ew(self, nid: str, fn: str, *xs: str) -> str:
        dims: DimMap = {}
        for x in xs:
            dims.update(self.dims[x])
        return self.add(nid, OpKind.ELEMENTWISE, list(xs), dims, fn=fn)

    def dropout(self, nid: str, x: str, p: float) -> str:
        return self.add(nid, OpKind.DROPOUT, [x], self.dims[x], p=p) if p > 0 else x

    def norm(self, nid: str, x: str, kind: str, dim: str = "hidden") -> str:
        size = self.dims[x][dim]
        w = self.param(f"{nid}.weight", {dim: size})
        ins = [x, w]
        if kind == "layernorm":
            ins.append(self.param(f"{nid}.bias", {dim: size}))
        return self.add(nid, OpKind.LAYERNORM if kind == "layernorm" else OpKind.RMSNORM, ins,
                        self.dims[x], dim=dim)


def _attention(b: _Builder, p: str, x: str, cfg: TransformerConfig, *, bias: bool, causal: bool,
               dropout: float, kv: str | None = None, pos_bias: str | None = None,
               qkv_bias: bool | None = None, qk_norm: str | None = None, **core: Any) -> str:
    """Self- (or cross-, when ``kv`` is given) attention; returns the output projection.
    ``qkv_bias``: biases on q, k and v (default: ``bias``); ``qk_norm``: the norm (``rmsnorm`` or
    ``layernorm``) of q and k over the head dim, None for none; ``core``: more attributes of the
    attention node (``window``). Rotary positions add no node: they rotate q and k in place of their
    projections' outputs and keep nothing for backward but the shared cosine and sine tables
    (Megatron-LM's ``apply_rotary_pos_emb``, fused or not), so the graph is the same with or without."""
    a, g, d = cfg.heads, cfg.n_kv_heads, cfg.d_head
    kvh = "heads" if g == a else "kv_heads"
    in_bias = bias if qkv_bias is None else qkv_bias
    # Megatron-LM's linear_qkv (self-attention) or linear_kv (cross-attention): one GEMM
    qkv = "qkv" if kv is None else None
    q = b.linear(f"{p}.q", x, ["hidden"], {"heads": a, "head_dim": d}, bias=in_bias, group=qkv)
    src = kv or x
    k = b.linear(f"{p}.k", src, ["hidden"], {kvh: g, "head_dim": d}, bias=in_bias, group=qkv or "kv")
    v = b.linear(f"{p}.v", src, ["hidden"], {kvh: g, "head_dim": d}, bias=in_bias, group=qkv or "kv")
    if qk_norm:
        q = b.norm(f"{p}.q_norm", q, qk_norm, dim="head_dim")
        k = b.norm(f"{p}.k_norm", k, qk_norm, dim="head_dim")
    ins = [q, k, v] + ([pos_bias] if pos_bias else [])
    if cfg.attention_sinks:
        ins.append(b.param(f"{p}.sinks", {"heads": a}))
        core["sinks"] = True
    ctx = b.add(f"{p}.core", OpKind.ATTENTION, ins, b.dims[q], causal=causal, dropout=dropout, **core)
    return b.linear(f"{p}.o", ctx, ["heads", "head_dim"], {"hidden": cfg.hidden}, bias=bias)


def _latent_attention(b: _Builder, p: str, x: str, cfg: TransformerConfig, **core: Any) -> str:
    """Multi-head latent attention (DeepSeek-V2/V3), causal, by its real shapes.

    q: ``hidden -> q_lora`` (RMSNorm) ``-> heads x (head_dim + qk_rope_dim)`` (or straight from
    hidden when ``q_lora_rank`` is 0). Keys and values: ``hidden -> kv_lora`` (RMSNorm) ``->
    heads x head_dim`` (keys, no position) and ``-> heads x v_head_dim`` (values), plus one rotary key
    part ``hidden -> qk_rope_dim`` shared by every head and joined to each head's key. The
    checkpoints fuse ``kv_a`` with ``k_rope`` and ``k_nope`` with ``v`` into one weight each: the
    same elements and FLOPs as the two matmuls written here.
    """
    a, d, r = cfg.heads, cfg.d_head, cfg.qk_rope_dim
    qk = {"heads": a, "head_dim": d + r}
    if cfg.q_lora_rank:
        cq = b.norm(f"{p}.q_a_norm", b.linear(f"{p}.q_a", x, ["hidden"], {"q_lora": cfg.q_lora_rank}, bias=False),
                    "rmsnorm", dim="q_lora")
        q = b.linear(f"{p}.q_b", cq, ["q_lora"], qk, bias=False)
    else:
        q = b.linear(f"{p}.q", x, ["hidden"], qk, bias=False)
    ckv = b.norm(f"{p}.kv_a_norm", b.linear(f"{p}.kv_a", x, ["hidden"], {"kv_lora": cfg.kv_lora_rank}, bias=False),
                 "rmsnorm", dim="kv_lora")
    k_rope = b.linear(f"{p}.k_rope", x, ["hidden"], {"head_dim": r}, bias=False)
    k_nope = b.linear(f"{p}.k_b", ckv, ["kv_lora"], {"heads": a, "head_dim": d}, bias=False)
    k = b.add(f"{p}.k", OpKind.CONCAT, [k_nope, k_rope], {**b.dims[k_nope], "head_dim": d + r}, dim="head_dim")
    v = b.linear(f"{p}.v_b", ckv, ["kv_lora"], {"heads": a, "v_head_dim": cfg.v_head_dim}, bias=False)
    out = {**b.dims[q]}
    del out["head_dim"]
    out["v_head_dim"] = cfg.v_head_dim
    ctx = b.add(f"{p}.core", OpKind.ATTENTION, [q, k, v], out, causal=True, dropout=cfg.dropout_p, head_dim="head_dim",
                **core)
    return b.linear(f"{p}.o", ctx, ["heads", "v_head_dim"], {"hidden": cfg.hidden}, bias=False)


def _mlp(b: _Builder, p: str, x: str, cfg: TransformerConfig, *, act: str, gated: bool, bias: bool,
         ffn: int | None = None) -> str:
    f = {"ffn": ffn or cfg.ffn}
    if gated:
        # Megatron-LM's linear_fc1 of a gated MLP: gate and up as one GEMM
        gate = b.linear(f"{p}.gate", x, ["hidden"], f, bias=bias, group="gate_up")
        up = b.linear(f"{p}.up", x, ["hidden"], f, bias=bias, group="gate_up")
        h = b.ew(f"{p}.mul", "mul", b.ew(f"{p}.act", act, gate), up)
    else:
        h = b.ew(f"{p}.act", act, b.linear(f"{p}.fc1", x, ["hidden"], f, bias=bias))
    return b.linear(f"{p}.fc2" if not gated else f"{p}.down", h, ["ffn"], {"hidden": cfg.hidden}, bias=bias)


def _expert_linear(b: _Builder, nid: str, x: str, w: str, out: str, bias: bool, group: str | None = None) -> str:
    """Every expert's own matmul of its tokens by weight ``w`` (contracting what is not ``expert``
    or ``out``), plus a per-expert bias over ``out``; ``group`` as :meth:`_Builder.linear`'s."""
    wd = b.dims[w]
    y = b.linear(f"{nid}.mm" if bias else nid, x, [d for d in wd if d not in ("expert", out)], {}, bias=False,
                 weight=w, group=group)
    if not bias:
        return y
    return b.ew(nid, "add", y, b.param(f"{nid}.bias", {"expert": wd["expert"], out: wd[out]}))


def _moe(b: _Builder, p: str, x: str, cfg: TransformerConfig, tokens: int) -> str:
    """Top-k routed experts: router, dispatch, expert MLPs, combine. A Mixtral's experts are SwiGLU, a
    GPT's GELU (not gated: ``linear_fc1``, GELU, ``linear_fc2``, as Megatron-LM's GPT with
    ``--num-experts``); with ``moe_bias`` a biased router and biased experts (gpt-oss), with
    ``shared_experts`` an MLP of the same kind every token goes through, added to the routed experts'
    output (DeepSeek)."""
    e, h = cfg.num_experts, cfg.hidden
    cap = math.ceil(tokens * cfg.top_k / e * cfg.capacity_factor)
    logits = b.linear(f"{p}.router", x, ["hidden"], {"expert": e}, bias=cfg.moe_bias)
    gates = b.add(f"{p}.gates", OpKind.SOFTMAX, [logits], b.dims[logits], dim="expert")
    xe = b.add(f"{p}.dispatch", OpKind.DISPATCH, [x, gates], {"expert": e, "capacity": cap, "hidden": h},
               top_k=cfg.top_k, capacity_factor=cfg.capacity_factor)
    f, bias, gated = cfg.ffn, cfg.moe_bias, cfg.family != "gpt"
    ins = ("gate", "up") if gated else ("fc1",)
    w_in = [b.param(f"{p}.experts.{name}.weight", {"expert": e, "hidden": h, "ffn": f}) for name in ins]
    wd = b.param(f"{p}.experts.down.weight", {"expert": e, "ffn": f, "hidden": h})
    if gated:
        # Megatron-LM's experts run gate and up as one linear_fc1 too
        gate, up = (_expert_linear(b, f"{p}.experts.{name}", xe, w, "ffn", bias, group="gate_up")
                    for name, w in zip(ins, w_in, strict=True))
        hidden = b.ew(f"{p}.experts.mul", "mul", b.ew(f"{p}.experts.act", "silu", gate), up)
    else:
        fc1 = _expert_linear(b, f"{p}.experts.fc1", xe, w_in[0], "ffn", bias)
        hidden = b.ew(f"{p}.experts.act", "gelu", fc1)
    y = _expert_linear(b, f"{p}.experts.down", hidden, wd, "hidden", bias)
    routed = b.add(f"{p}.combine", OpKind.COMBINE, [y, gates], b.dims[x])
    if not cfg.shared_experts:
        return routed
    shared = _mlp(b, f"{p}.shared", x, cfg, act="silu" if gated else "gelu", gated=gated, bias=False,
                  ffn=cfg.shared_experts * f)
    return b.ew(f"{p}.sum", "add", routed, shared)


def _decoder_only(b: _Builder, cfg: TransformerConfig, batch: int, seq: int) -> None:
    """GPT, Llama and Mixtral (Megatron-LM's GPTModel): ``cfg.norm_kind`` normalisation,
    ``cfg.position_kind`` positions, biases on the linear layers where ``cfg.linear_biases``."""
    gpt = cfg.family == "gpt"
    drop = cfg.dropout_p
    norm, bias = cfg.norm_kind, cfg.linear_biases
    tokens = b.input("tokens", {"batch": batch, "seq": seq})
    wte = b.param("embed.tokens.weight", {"vocab": cfg.vocab, "hidden": cfg.hidden})
    x = b.add("embed.tokens", OpKind.EMBEDDING, [tokens, wte], {"batch": batch, "seq": seq, "hidden": cfg.hidden},
              index_dim="vocab")
    if cfg.position_kind == "learned":
        # position ids per sample, as Megatron-LM's [b, s]: the lookup splits the batch like the rest
        pos = b.input("position_ids", {"batch": batch, "seq": seq})
        wpe = b.param("embed.positions.weight", {"positions": cfg.seq_len, "hidden": cfg.hidden})
        pe = b.add("embed.positions", OpKind.EMBEDDING, [pos, wpe], {"batch": batch, "seq": seq, "hidden": cfg.hidden},
                   index_dim="positions")
        x = b.ew("embed.sum", "add", x, pe)
    x = b.dropout("embed.dropout", x, drop)
    for i in range(cfg.layers):
        p = f"layers.{i}"
        b.unit(p)
        h = b.norm(f"{p}.ln1", x, norm)
        # a sliding window changes the work, not the graph's tensors (see compute.attention_flops)
        core: dict[str, Any] = {} if cfg.is_global_attention(i) else {"window": cfg.sliding_window}
        if cfg.mla:
            h = _latent_attention(b, f"{p}.attn", h, cfg, **core)
        else:
            h = _attention(b, f"{p}.attn", h, cfg, bias=bias or cfg.attention_bias, causal=True, dropout=drop,
                           qkv_bias=bias or cfg.qkv_bias or cfg.attention_bias,
                           qk_norm=norm if cfg.qk_norm else None, **core)
        if cfg.sandwich_norms:
            h = b.norm(f"{p}.attn.norm", h, norm)
        h = b.dropout(f"{p}.attn.dropout", h, drop)
        x = b.ew(f"{p}.residual1", "add", x, h)
        h = b.norm(f"{p}.ln2", x, norm)
        if cfg.is_moe and i >= cfg.dense_layers:
            h = _moe(b, f"{p}.moe", h, cfg, batch * seq)
        else:
            h = _mlp(b, f"{p}.mlp", h, cfg, act="gelu" if gpt else cfg.activation, gated=not gpt, bias=bias,
                     ffn=cfg.dense_ffn if cfg.is_moe else None)
        if cfg.sandwich_norms:
            h = b.norm(f"{p}.mlp.norm", h, norm)
        h = b.dropout(f"{p}.mlp.dropout", h, drop)
        x = b.ew(f"{p}.residual2", "add", x, h)
    b.unit("head")
    _lm_head(b, cfg, x, norm, wte, batch, seq)


def _lm_head(b: _Builder, cfg: TransformerConfig, x: str, norm: str, wte: str, batch: int, seq: int,
             seq_dim: str = "seq") -> None:
    x = b.norm("head.norm", x, norm)
    w = wte if cfg.tied_embeddings else b.param("head.lm.weight", {"vocab": cfg.vocab, "hidden": cfg.hidden})
    logits = b.linear("head.lm", x, ["hidden"], {}, bias=False, weight=w)
    labels = b.input("labels", {"batch": batch, seq_dim: seq})
    b.add("head.loss", OpKind.CROSS_ENTROPY, [logits, labels], {"batch": batch, seq_dim: seq}, dtype="fp32",
          class_dim="vocab")


def _bert(b: _Builder, cfg: TransformerConfig, batch: int, seq: int) -> None:
    drop = cfg.dropout_p
    tokens = b.input("tokens", {"batch": batch, "seq": seq})
    types = b.input("token_type_ids", {"batch": batch, "seq": seq})
    pos = b.input("position_ids", {"batch": batch, "seq": seq})
    h = cfg.hidden
    wte = b.param("embed.tokens.weight", {"vocab": cfg.vocab, "hidden": h})
    we = b.add("embed.tokens", OpKind.EMBEDDING, [tokens, wte], {"batch": batch, "seq": seq, "hidden": h},
               index_dim="vocab")
    wpe = b.param("embed.positions.weight", {"positions": cfg.seq_len, "hidden": h})
    pe = b.add("embed.positions", OpKind.EMBEDDING, [pos, wpe], {"batch": batch, "seq": seq, "hidden": h},
               index_dim="positions")
    wtt = b.param("embed.types.weight", {"types": cfg.type_vocab, "hidden": h})
    te = b.add("embed.types", OpKind.EMBEDDING, [types, wtt], {"batch": batch, "seq": seq, "hidden": h},
               index_dim="types")
    x = b.ew("embed.sum2", "add", b.ew("embed.sum", "add", we, pe), te)
    x = b.dropout("embed.dropout", b.norm("embed.norm", x, "layernorm"), drop)
    for i in range(cfg.layers):
        p = f"layers.{i}"
        b.unit(p)
        a = _attention(b, f"{p}.attn", x, cfg, bias=True, causal=False, dropout=drop)
        x = b.norm(f"{p}.ln1", b.ew(f"{p}.residual1", "add", x, b.dropout(f"{p}.attn.dropout", a, drop)), "layernorm")
        m = _mlp(b, f"{p}.mlp", x, cfg, act="gelu", gated=False, bias=True)
        x = b.norm(f"{p}.ln2", b.ew(f"{p}.residual2", "add", x, b.dropout(f"{p}.mlp.dropout", m, drop)), "layernorm")
    b.unit("head")
    pooled_in = b.add("head.pool", OpKind.REDUCE, [x], {"batch": batch, "hidden": h}, over=["seq"], op="first")
    pooled = b.linear("head.pooler", pooled_in, ["hidden"], {"pooled": h}, bias=True)
    b.ew("head.pooler.act", "tanh", pooled)
    xr = b.add("head.rename", OpKind.RESHAPE, [x], {"batch": batch, "seq": seq, "hidden_in": h})
    t = b.ew("head.transform.act", "gelu", b.linear("head.transform", xr, ["hidden_in"], {"hidden": h}, bias=True))
    t = b.norm("head.transform.norm", t, "layernorm")
    logits = b.linear("head.lm.mm", t, ["hidden"], {}, bias=False, weight=wte)
    bias = b.param("head.lm.bias", {"vocab": cfg.vocab})
    logits = b.ew("head.lm", "add", logits, bias)
    labels = b.input("labels", {"batch": batch, "seq": seq})
    b.add("head.loss", OpKind.CROSS_ENTROPY, [logits, labels], {"batch": batch, "seq": seq}, dtype="fp32",
          class_dim="vocab")


def _t5(b: _Builder, cfg: TransformerConfig, batch: int, seq: int, tgt: int) -> None:
    drop = cfg.dropout_p
    h = cfg.hidden
    act = "gelu" if cfg.gated_mlp else "relu"
    shared = b.param("embed.shared.weight", {"vocab": cfg.vocab, "hidden": h})
    src = b.input("tokens", {"batch": batch, "seq": seq})
    x = b.add("embed.encoder", OpKind.EMBEDDING, [src, shared], {"batch": batch, "seq": seq, "hidden": h},
              index_dim="vocab")
    x = b.dropout("embed.encoder.dropout", x, drop)
    tgt_tokens = b.input("decoder_tokens", {"batch": batch, "tgt_seq": tgt})
    y = b.add("embed.decoder", OpKind.EMBEDDING, [tgt_tokens, shared], {"batch": batch, "tgt_seq": tgt, "hidden": h},
              index_dim="vocab")
    y = b.dropout("embed.decoder.dropout", y, drop)

    def rel_bias(p: str, q_dim: str, q_len: int) -> str:
        ids = b.input(f"{p}.rel_ids", {q_dim: q_len, "kv_seq": q_len})
        table = b.param(f"{p}.rel_bias.weight", {"buckets": cfg.relative_buckets, "heads": cfg.heads})
        dims = {q_dim: q_len, "kv_seq": q_len, "heads": cfg.heads}
        return b.add(f"{p}.rel_bias", OpKind.EMBEDDING, [ids, table], dims,
                     index_dim="buckets")

    enc_bias = ""
    for i in range(cfg.layers):
        p = f"encoder.{i}"
        b.unit(p)
        if i == 0:
            enc_bias = rel_bias(p, "seq", seq)
        a = _attention(b, f"{p}.attn", b.norm(f"{p}.ln1", x, "rmsnorm"), cfg, bias=False, causal=False,
                       dropout=drop, pos_bias=enc_bias)
        x = b.ew(f"{p}.residual1", "add", x, b.dropout(f"{p}.attn.dropout", a, drop))
        m = _mlp(b, f"{p}.mlp", b.norm(f"{p}.ln2", x, "rmsnorm"), cfg, act=act, gated=cfg.gated_mlp, bias=False)
        x = b.ew(f"{p}.residual2", "add", x, b.dropout(f"{p}.mlp.dropout", m, drop))
    b.unit("encoder.final")
    enc = b.dropout("encoder.final.dropout", b.norm("encoder.final.norm", x, "rmsnorm"), drop)
    # Cross-attention keys/values are computed from the encoder output inside each decoder block.
    dec_bias = ""
    for i in range(cfg.decoder_layers):
        p = f"decoder.{i}"
        b.unit(p)
        if i == 0:
            dec_bias = rel_bias(p, "tgt_seq", tgt)
        a = _attention(b, f"{p}.attn", b.norm(f"{p}.ln1", y, "rmsnorm"), cfg, bias=False, causal=True,
                       dropout=drop, pos_bias=dec_bias)
        y = b.ew(f"{p}.residual1", "add", y, b.dropout(f"{p}.attn.dropout", a, drop))
        c = _attention(b, f"{p}.cross", b.norm(f"{p}.ln2", y, "rmsnorm"), cfg, bias=False, causal=False,
                       dropout=drop, kv=enc)
        y = b.ew(f"{p}.residual2", "add", y, b.dropout(f"{p}.cross.dropout", c, drop))
        m = _mlp(b, f"{p}.mlp", b.norm(f"{p}.ln3", y, "rmsnorm"), cfg, act=act, gated=cfg.gated_mlp, bias=False)
        y = b.ew(f"{p}.residual3", "add", y, b.dropout(f"{p}.mlp.dropout", m, drop))
    b.unit("head")
    y = b.dropout("head.dropout", y, drop)
    _lm_head(b, cfg, y, "rmsnorm", shared, batch, tgt, seq_dim="tgt_seq")


def _vit(b: _Builder, cfg: TransformerConfig, batch: int) -> None:
    h, n = cfg.hidden, cfg.num_patches
    pd = cfg.channels * cfg.patch_size**2
    pixels = b.input("pixels", {"batch": batch, "seq": n, "patch_dim": pd}, dtype="bf16")
    pe = b.linear("embed.patch", pixels, ["patch_dim"], {"hidden": h}, bias=True)
    cls = b.param("embed.cls", {"seq": 1, "hidden": h})
    x = b.add("embed.concat", OpKind.CONCAT, [cls, pe], {"batch": batch, "seq": n + 1, "hidden": h}, dim="seq")
    pos = b.param("embed.positions.weight", {"seq": n + 1, "hidden": h})
    x = b.ew("embed.sum", "add", x, pos)
    for i in range(cfg.layers):
        p = f"layers.{i}"
        b.unit(p)
        a = _attention(b, f"{p}.attn", b.norm(f"{p}.ln1", x, "layernorm"), cfg, bias=True, causal=False, dropout=0.0)
        x = b.ew(f"{p}.residual1", "add", x, a)
        m = _mlp(b, f"{p}.mlp", b.norm(f"{p}.ln2", x, "layernorm"), cfg, act="gelu", gated=False, bias=True)
        x = b.ew(f"{p}.residual2", "add", x, m)
    b.unit("head")
    x = b.norm("head.norm", x, "layernorm")
    if cfg.num_classes > 0:
        pooled = b.add("head.pool", OpKind.REDUCE, [x], {"batch": batch, "hidden": h}, over=["seq"], op="first")
        logits = b.linear("head.classifier", pooled, ["hidden"], {"classes": cfg.num_classes}, bias=True)
        labels = b.input("labels", {"batch": batch})
        b.add("head.loss", OpKind.CROSS_ENTROPY, [logits, labels], {"batch": batch}, dtype="fp32", class_dim="classes")


def check_seq_len(cfg: TransformerConfig, seq: int) -> None:
    """ConfigError when a model with learned positions (BERT; GPT unless it has other positions) is
    asked for a longer sequence than its position table has rows."""
    learned = cfg.family == "bert" or (cfg.family in DECODER_FAMILIES and cfg.position_kind == "learned")
    if learned and seq > cfg.seq_len:
        raise ConfigError(f"{cfg.name}: seq_len {seq} exceeds the {cfg.seq_len} learned positions")


def build_graph(cfg: TransformerConfig, batch: int = 1, seq_len: int | None = None,
                decoder_seq_len: int | None = None) -> Graph:
    """The operator graph of one micro-batch of ``batch`` samples.

    ``seq_len`` defaults to ``cfg.seq_len``; models with learned positions accept at most that.
    ``decoder_seq_len`` (T5) defaults to ``seq_len``. ViT ignores both (its tokens are patches).
    """
    if batch <= 0:
        raise ConfigError(f"batch must be positive, got {batch}")
    seq = cfg.seq_len if seq_len is None else seq_len
    if seq <= 0:
        raise ConfigError(f"seq_len must be positive, got {seq}")
    check_seq_len(cfg, seq)
    b = _Builder()
    b.unit("embed")
    if cfg.family in ("gpt", "llama", "mixtral"):
        _decoder_only(b, cfg, batch, seq)
    elif cfg.family == "bert":
        _bert(b, cfg, batch, seq)
    elif cfg.family == "t5":
        _t5(b, cfg, batch, seq, decoder_seq_len or seq)
    elif cfg.family == "vit":
        _vit(b, cfg, batch)
    else:  # pragma: no cover - Literal type forbids it
        raise ConfigError(f"unknown family {cfg.family!r}")
    meta = {"family": cfg.family, "model": cfg.name, "batch": batch,
            "seq_len": cfg.tokens_per_sample if cfg.family == "vit" else seq,
            "units": b.units, "hidden": cfg.hidden, "heads": cfg.heads, "layers": cfg.total_layers,
            "vocab": cfg.vocab}
    return Graph.of(cfg.name, b.nodes, meta)

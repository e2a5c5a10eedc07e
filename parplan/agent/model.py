"""PyTorch transformers with exactly the architecture of the cost model's graph builder.

:func:`build_model` turns a :class:`~parplan.solver.frontends.config.TransformerConfig` of the
``gpt`` or ``llama`` family into an ``nn.Module`` whose parameters are, name for name and
shape for shape, the parameters of :func:`parplan.solver.frontends.builder.build_graph`
(``embed.tokens.weight``, ``layers.3.attn.q.weight``, ``head.norm.weight`` ...), so that
parameter counts agree exactly and measured memory can be compared with the prediction:

- ``gpt``: learned positions (a table of ``cfg.seq_len`` rows), LayerNorm with bias, separate
  Q/K/V/O projections with bias, GELU MLP with biases, dropout (``cfg.dropout_p``, 0.1 unless set:
  embedding, attention probabilities inside scaled-dot-product attention, after the attention
  output and after the MLP), final LayerNorm, LM head tied to the token embedding (no bias),
  cross-entropy;
- ``llama``: RMSNorm (weight only), no biases, grouped-query attention with RoPE (no
  parameters), SwiGLU MLP (gate/up/down), untied LM head, no dropout unless ``cfg.dropout`` sets
  one (at the same places as GPT's);
- either with the architecture's own normalisation, positions and linear biases
  (``cfg.norm_kind``, ``cfg.position_kind``, ``cfg.linear_biases``) in place of its family's.

The model is cut into ``embed``, ``layers.<i>`` and ``head`` like the graph's units, so a
pipeline stage is simply a contiguous range of them (:class:`StageModule`). Everything runs
on local tensors; tensor parallelism is applied from outside with ``parallelize_module`` and
works because the attention infers its (local) head count from the projection's output width.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch
import torch.nn.functional as nnf
from torch import nn
from torch.utils.checkpoint import checkpoint

from parplan.agent.memtrack import mark_activation
from parplan.agent.module_checkpoint import run_checkpointed
from parplan.agent.op_checkpoint import op_checkpoint_context
from parplan.solver.cost.activations import Recompute
from parplan.solver.errors import ConfigError
from parplan.solver.frontends.config import TransformerConfig, extra_features

#: Families the executor can build.
SUPPORTED_FAMILIES = ("gpt", "llama")

ROPE_THETA = 10000.0
NORM_EPS = 1e-5


def check_supported(cfg: TransformerConfig) -> None:
    """ConfigError unless the executor can build ``cfg``."""
    if cfg.family not in SUPPORTED_FAMILIES:
        raise ConfigError(f"the validation agent builds {' and '.join(SUPPORTED_FAMILIES)} models only, "
                          f"not {cfg.family!r} ({cfg.name})")
    extra = extra_features(asdict(cfg))
    if extra:
        raise ConfigError(f"the validation agent does not build {', '.join(extra)} yet ({cfg.name})")
    if cfg.family != "gpt" and cfg.dropout_p > 0:
        raise ConfigError(f"the validation agent builds dropout into GPT models only, not {cfg.family!r} ({cfg.name})")
    if cfg.qkv_bias or cfg.qk_norm:
        raise ConfigError(f"the validation agent does not build q/k/v biases or q/k norms (Qwen) yet ({cfg.name})")


class Dropout(nn.Module):
    """Dropout whose probability can be switched off for exact comparisons (``enabled``)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p
        self.enabled = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.p > 0 and self.enabled and self.training:
            return _dropout(x, self.p)
        return x


def _dropout(x: torch.Tensor, p: float) -> torch.Tensor:
    """``torch.native_dropout``: the kernel ``torch.nn.functional.dropout`` runs on GPUs, which keeps a 1-byte mask
    for backward. (On the CPU ``torch.nn.functional.dropout`` takes a composite path whose mask has the input's
    dtype, 4 bytes in fp32; calling the native kernel makes the CPU measurement stand for the GPU.)"""
    out: torch.Tensor = torch.native_dropout(x, p, True)[0]
    return out


class Embed(nn.Module):
    """Token embedding (+ learned positions) and embedding dropout.

    With sequence parallelism the token embedding returns this rank's slice of the sequence;
    ``seq_rank`` (set by the executor) tells which positions that slice holds."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.tokens = nn.Embedding(cfg.vocab, cfg.hidden)
        self.positions = nn.Embedding(cfg.seq_len, cfg.hidden) if cfg.position_kind == "learned" else None
        self.dropout = Dropout(cfg.dropout_p) if cfg.dropout_p > 0 else None
        self.seq_rank = 0

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x: torch.Tensor = self.tokens(tokens)
        if self.positions is not None:
            local = x.shape[1]
            start = self.seq_rank * local
            pos = torch.arange(start, start + local, device=tokens.device).unsqueeze(0)
            x = x + self.positions(pos)
        if self.dropout is None:
            return x
        out: torch.Tensor = self.dropout(x)
        return out


def rope_tables(seq_len: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosines and sines of rotary position embeddings, (seq_len, head_dim) each, computed once
    per model and shared by every layer (as Llama implementations precompute them)."""
    inv = 1.0 / (ROPE_THETA ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    ang = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv)
    return torch.cat((ang.cos(), ang.cos()), dim=-1), torch.cat((ang.sin(), ang.sin()), dim=-1)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    """Q/K/V/O projections around ``scaled_dot_product_attention`` (causal)."""

    def __init__(self, cfg: TransformerConfig, bias: bool, dropout: float, rope: bool) -> None:
        super().__init__()
        d = cfg.d_head
        self.head_dim = d
        self.q = nn.Linear(cfg.hidden, cfg.heads * d, bias=bias)
        self.k = nn.Linear(cfg.hidden, cfg.n_kv_heads * d, bias=bias)
        self.v = nn.Linear(cfg.hidden, cfg.n_kv_heads * d, bias=bias)
        self.o = nn.Linear(cfg.heads * d, cfg.hidden, bias=bias)
        self.dropout = dropout
        self.dropout_enabled = True
        self.rope = rope
        self.recompute_core = False
        self.rope_cos: torch.Tensor
        self.rope_sin: torch.Tensor

    def set_rope_tables(self, cos: torch.Tensor, sin: torch.Tensor) -> None:
        """Share one (seq, head_dim) table of RoPE cosines and sines (non-persistent buffers)."""
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        d = self.head_dim
        # (b, s, heads, d) viewed as (b, heads, s, d): the kernel then writes its output in
        # (b, s, heads, d) order and the reshape before the output projection is free.
        q = self.q(x).view(b, s, -1, d).transpose(1, 2)
        k = self.k(x).view(b, s, -1, d).transpose(1, 2)
        v = self.v(x).view(b, s, -1, d).transpose(1, 2)
        if self.rope:
            cos, sin = self.rope_cos[:s].to(q.dtype), self.rope_sin[:s].to(q.dtype)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        p = self.dropout if (self.training and self.dropout_enabled) else 0.0
        if self.recompute_core and torch.is_grad_enabled():
            ctx: torch.Tensor = checkpoint(_core, q, k, v, p, use_reentrant=False)
        else:
            ctx = _core(q, k, v, p)
        out: torch.Tensor = self.o(ctx.transpose(1, 2).reshape(b, s, -1))
        return out


def attention_kernel(device: torch.device, dropout: float, dtype: torch.dtype = torch.float32) -> str:
    """Which attention core :class:`Attention` runs on ``dtype`` tensors: ``unfused`` (scores
    materialised) or the name of the fused ``scaled_dot_product_attention`` kernel the dispatcher picks."""
    if dropout > 0 and device.type == "cpu":
        return "unfused"
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: list[str] = []

    class _Names(TorchDispatchMode):  # type: ignore[no-untyped-call]
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    q = torch.zeros(1, 2, 8, 16, device=device, dtype=dtype)
    with _Names():  # type: ignore[no-untyped-call]
        nnf.scaled_dot_product_attention(q, q, q, dropout_p=dropout, is_causal=True)
    fused = [n for n in seen if "scaled_dot_product" in n]
    return fused[0].removeprefix("aten.").split(".")[0] if fused else "math"


def _core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: float) -> torch.Tensor:
    """Causal attention over (b, heads, s, d). With dropout on the CPU, whose fused kernel has no
    dropout, it is Megatron-LM's unfused core (scores, softmax, 1-byte dropout mask, probabilities
    times values), so what it keeps for backward is what the cost model's non-flash term counts;
    otherwise ``torch.nn.functional.scaled_dot_product_attention`` (a flash kernel: no scores kept)."""
    gqa = q.shape[1] != k.shape[1]
    if p > 0 and q.device.type == "cpu":
        if gqa:
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        s = q.shape[2]
        scores = (q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-2, -1)
        # An additive causal bias: unlike masked_fill, the addition keeps nothing for backward.
        bias = torch.full((s, s), float("-inf"), dtype=scores.dtype, device=q.device).triu(1)
        probs = torch.softmax(scores + bias, dim=-1)
        out: torch.Tensor = _dropout(probs, p) @ v
        return out
    if gqa and q.device.type == "cuda":
        # as torchtitan does (the cost model's runtime ``torch``): the memory-efficient kernel has
        # no grouped-query support, and SDPA's fallback for it keeps the whole score matrix
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        gqa = False
    res: torch.Tensor = nnf.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True, enable_gqa=gqa)
    return res


class MLP(nn.Module):
    """GELU MLP (GPT: fc1/fc2) or SwiGLU (Llama: gate/up/down), biased where ``cfg.linear_biases``."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.gated = cfg.family != "gpt"
        bias = cfg.linear_biases
        if self.gated:
            self.gate = nn.Linear(cfg.hidden, cfg.ffn, bias=bias)
            self.up = nn.Linear(cfg.hidden, cfg.ffn, bias=bias)
            self.down = nn.Linear(cfg.ffn, cfg.hidden, bias=bias)
        else:
            self.fc1 = nn.Linear(cfg.hidden, cfg.ffn, bias=bias)
            self.fc2 = nn.Linear(cfg.ffn, cfg.hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor
        if self.gated:
            out = self.down(nnf.silu(self.gate(x)) * self.up(x))
        else:
            out = self.fc2(nnf.gelu(self.fc1(x)))
        return out


def _norm(cfg: TransformerConfig) -> nn.Module:
    if cfg.norm_kind == "layernorm":
        return nn.LayerNorm(cfg.hidden, eps=NORM_EPS)
    return nn.RMSNorm(cfg.hidden, eps=NORM_EPS)


class Block(nn.Module):
    """Pre-norm transformer block; ``checkpointed`` recomputes all of it in backward
    (``torch.utils.checkpoint``, non-reentrant), Megatron's full recomputation, or with
    ``per_operator`` all but the outputs torchtitan's per-operator policy keeps (:mod:`.op_checkpoint`);
    ``recompute_norms`` and ``recompute_mlp``: Megatron-LM's ``layernorm`` and ``mlp`` modules
    (:mod:`.module_checkpoint`)."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        drop = cfg.dropout_p
        self.ln1 = _norm(cfg)
        self.attn = Attention(cfg, bias=cfg.linear_biases, dropout=drop, rope=cfg.position_kind == "rope")
        # no dropout (Llama's): no module at all (an identity module confuses hook-based tracking)
        self.attn_dropout = Dropout(drop) if drop > 0 else None
        self.ln2 = _norm(cfg)
        self.mlp = MLP(cfg)
        self.mlp_dropout = Dropout(drop) if drop > 0 else None
        self.checkpointed = False
        self.per_operator = False
        self.recompute_norms = False
        self.recompute_mlp = False

    def _body(self, x: torch.Tensor) -> torch.Tensor:
        modules = (self.recompute_norms or self.recompute_mlp) and torch.is_grad_enabled()
        h = run_checkpointed(self.ln1, self.attn, x, self.recompute_norms, False) if modules else self.attn(self.ln1(x))
        x = x + (self.attn_dropout(h) if self.attn_dropout is not None else h)
        h = (run_checkpointed(self.ln2, self.mlp, x, self.recompute_norms, self.recompute_mlp) if modules
             else self.mlp(self.ln2(x)))
        out: torch.Tensor = x + (self.mlp_dropout(h) if self.mlp_dropout is not None else h)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.checkpointed and torch.is_grad_enabled():
            mark_activation(x)  # the checkpoint keeps the block's input for its recomputation
            context: dict[str, Any] = {"context_fn": op_checkpoint_context} if self.per_operator else {}
            out: torch.Tensor = checkpoint(self._body, x, use_reentrant=False, **context)
            return out
        return self._body(x)


class Head(nn.Module):
    """Final norm, LM head and the mean cross-entropy over all tokens of the micro-batch."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.norm = _norm(cfg)
        self.lm = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        self.loss_parallel = False
        #: another trainer's loss on the logits and labels (nanotron's: :mod:`parplan.agent.nanotron_exec`)
        self.loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.lm(self.norm(x))
        if self.loss_fn is not None:
            return self.loss_fn(logits, labels)
        # in fp32, as torchtitan's and Hugging Face's losses compute it (a no-op for fp32 logits)
        loss: torch.Tensor = nnf.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))
        return loss


class Transformer(nn.Module):
    """``embed`` → ``layers.<i>`` → ``head``; ``forward(tokens, labels)`` returns the loss."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        check_supported(cfg)
        self.cfg = cfg
        self.embed = Embed(cfg)
        self.layers = nn.ModuleDict({str(i): Block(cfg) for i in range(cfg.layers)})
        self.head = Head(cfg)
        if cfg.tied_embeddings:
            self.head.lm.weight = self.embed.tokens.weight
        if cfg.position_kind == "rope":
            cos, sin = rope_tables(cfg.seq_len, cfg.d_head)
            for blk in self.layers.values():
                assert isinstance(blk, Block)
                blk.attn.set_rope_tables(cos, sin)
        _init_weights(self)

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for blk in self.layers.values():
            x = blk(x)
        out: torch.Tensor = self.head(x, labels)
        return out


def _init_weights(model: nn.Module) -> None:
    """GPT-2-style initialisation (deterministic under a seed); norms keep ones/zeros."""
    for name, p in model.named_parameters():
        if p.dim() >= 2 or (name.endswith("bias") and "ln" not in name and "norm" not in name):
            nn.init.normal_(p, mean=0.0, std=0.02)


class StageModule(nn.Module):
    """A contiguous slice of a :class:`Transformer`: optionally the embedding, some blocks and
    optionally the head. ``forward(x, labels)`` returns the hidden states, or the loss when
    the slice holds the head (so a pipeline's last stage computes its loss itself)."""

    def __init__(self, model: Transformer, layer_ids: list[int], first: bool, last: bool) -> None:
        super().__init__()
        self.embed = model.embed if first else None
        self.layers = nn.ModuleDict({str(i): model.layers[str(i)] for i in layer_ids})
        self.head = model.head if last else None

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for blk in self.layers.values():
            x = blk(x)
        if self.head is not None:
            assert labels is not None
            out: torch.Tensor = self.head(x, labels)
            return out
        return x


def build_model(cfg: TransformerConfig, seed: int = 0) -> Transformer:
    """The model of ``cfg`` in fp32 on the CPU, initialised from ``seed`` (same on every rank)."""
    torch.manual_seed(seed)
    return Transformer(cfg)


def set_dropout(model: nn.Module, enabled: bool) -> None:
    """Switch every dropout of ``model`` (hidden and attention) on or off."""
    for m in model.modules():
        if isinstance(m, Dropout):
            m.enabled = enabled
        elif isinstance(m, Attention):
            m.dropout_enabled = enabled


def set_recompute(model: nn.Module, policy: str) -> None:
    """``full``: checkpoint every block; ``op``: checkpoint every block keeping what torchtitan's
    per-operator policy keeps; ``selective``: checkpoint the attention core only (it then keeps Q, K,
    V and its output, like a flash kernel); ``selective:MODULE+...``: Megatron-LM's module set
    (``core_attn``, ``layernorm``, ``mlp``; ``moe``, ``moe_act`` and ``shared_experts`` name no module
    of a dense block, which Megatron-LM skips too); ``none``: keep everything."""
    modules = Recompute(policy).modules
    for m in model.modules():
        if isinstance(m, Block):
            m.checkpointed = policy in ("full", "op")
            m.per_operator = policy == "op"
            m.recompute_norms = "layernorm" in modules
            m.recompute_mlp = "mlp" in modules
        elif isinstance(m, Attention):
            m.recompute_core = "core_attn" in modules


def parameter_count(model: nn.Module) -> int:
    """Distinct parameters (a tied weight counts once)."""
    seen: dict[int, int] = {}
    for p in model.parameters():
        seen[id(p)] = p.numel()
    return sum(seen.values())


def stage_layer_ranges(num_layers: int, partition: tuple[int, ...]) -> list[list[int]]:
    """Block ids per (virtual) stage for a partition (blocks per stage)."""
    out: list[list[int]] = []
    start = 0
    for n in partition:
        out.append(list(range(start, start + n)))
        start += n
    if start != num_layers:
        raise ConfigError(f"partition {list(partition)} does not cover the {num_layers} blocks")
    return out


def describe(cfg: TransformerConfig) -> dict[str, Any]:
    """The shape fields of ``cfg`` as JSON-able data."""
    return {"family": cfg.family, "name": cfg.name, "layers": cfg.layers, "hidden": cfg.hidden,
            "heads": cfg.heads, "kv_heads": cfg.n_kv_heads, "ffn": cfg.ffn, "vocab": cfg.vocab,
            "seq_len": cfg.seq_len, "tied_embeddings": cfg.tied_embeddings,
            "head_dim": cfg.d_head}

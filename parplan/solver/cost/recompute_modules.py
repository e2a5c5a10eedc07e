"""Megatron-LM's per-module selective recomputation (``--recompute-granularity selective
--recompute-modules ...``): which submodules of each transformer layer are checkpointed, what that
keeps for backward and what its backward runs again.

A module set is written ``selective:<module>+<module>...`` (Megatron-LM's names, in its order:
:data:`MODULES`); ``selective`` alone stays the attention core (``core_attn``, Megatron-LM's default)
and is what :class:`~parplan.solver.cost.activations.Recompute` calls ``SELECTIVE``.

Megatron-LM checkpoints a module in one of two ways (``megatron/core/transformer/transformer_config.py``,
``recompute_modules``):

- ``tensor_parallel.checkpoint`` (``core_attn``, ``mlp``, ``moe``, ``shared_experts``): the module runs
  without saving anything; the checkpoint keeps the module's inputs and backward runs the module
  again. Its output is saved by its consumers as usual.
- ``CheckpointWithoutOutput`` (``layernorm``, ``moe_act``): the same, and the output's storage is
  freed once its consumers ran (``discard_output_and_register_recompute``): whoever saved the
  output keeps nothing; a gradient hook refills it before their backward.

Per module (``megatron/core/transformer/transformer_layer.py``, ``moe/moe_layer.py``,
``moe/experts.py``), as priced here for Megatron-LM's Transformer Engine layer spec
(``gpt_layer_specs.py``), the one parplan's export launches:

- ``layernorm``: the layer's norms that are modules of their own. Transformer Engine fuses the input
  norm into the QKV projection and a dense layer's pre-MLP norm into ``linear_fc1``
  (``IdentityOp`` norms, which ``TransformerLayer`` skips); a mixture of experts keeps a separate
  pre-MLP norm (its router, dispatcher and shared experts read it): that norm's output is dropped.
  Where the norms are modules of their own (Megatron-LM's local spec, the validation agent's model:
  ``fused_norms`` false), both norms of every layer are, each keeping its input, the residual stream.
- ``mlp``: a dense layer's MLP (MoE layers are skipped), with its fused pre-MLP norm: keeps the
  layer's residual stream only; with norms of their own, the MLP alone: keeps the norm's output.
- ``moe``: the whole MoE layer (router, dispatch and combine with their all-to-alls, experts,
  shared experts): keeps the pre-MLP norm's output only.
- ``shared_experts``: the shared experts' MLP: keeps its input (the pre-MLP norm's output).
- ``moe_act``: the experts' activation (``bias_act_func``: the SwiGLU and its bias): keeps
  ``linear_fc1``'s output; the activation's output, which ``linear_fc2`` saved, is dropped.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from parplan.solver.ir import Graph, Node, OpKind

#: Megatron-LM's module names, in the order its help lists them (``TransformerConfig.recompute_modules``).
MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
#: Modules Megatron-LM checkpoints with ``CheckpointWithoutOutput`` (their output's storage freed).
DISCARDS_OUTPUT = frozenset({"layernorm", "moe_act"})
#: How a module set is written after ``selective``.
PREFIX = "selective:"
SEPARATOR = "+"
#: Megatron-LM's default module set (``TransformerConfig.__post_init__``).
DEFAULT = frozenset({"core_attn"})


@functools.lru_cache(maxsize=256)
def parse_modules(text: str) -> frozenset[str]:
    """The modules of ``core_attn+mlp`` (or ``core_attn mlp``, ``core_attn,mlp``); ValueError with one
    line for a name Megatron-LM does not know."""
    names = [m for m in text.replace(",", " ").replace(SEPARATOR, " ").split() if m]
    unknown = sorted(set(names) - set(MODULES))
    if unknown:
        raise ValueError(f"unknown recompute module(s) {', '.join(unknown)}: Megatron-LM's are {', '.join(MODULES)}")
    return frozenset(names)


def modules_value(modules: frozenset[str]) -> str:
    """The canonical spelling of a module set: ``none`` (no module), ``selective`` (the attention
    core alone) or ``selective:<modules in Megatron-LM's order>``."""
    if not modules:
        return "none"
    if modules == DEFAULT:
        return "selective"
    return PREFIX + SEPARATOR.join(m for m in MODULES if m in modules)


def refusal(modules: frozenset[str], runs_modules: bool, te_fp8_delayed: bool) -> str | None:
    """Why a module set cannot be priced or run, in one line; None when it can. Megatron-LM refuses
    ``moe_act`` and ``layernorm`` under FP8 delayed scaling (``transformer_config.py``); parplan does
    not build multi-head latent attention's up-projection recompute (``mla_up_proj``). ``runs_modules``:
    whether the runtime runs module sets (:attr:`~.runtime.Runtime.runs_recompute_modules`)."""
    if not runs_modules:
        return (f"recompute {modules_value(modules)} is Megatron-LM's --recompute-modules: only the megatron "
                "runtime (and the validation agent's torch runtimes) run it")
    if "mla_up_proj" in modules:
        return "recompute module mla_up_proj (multi-head latent attention's up-projections) is not modelled"
    if te_fp8_delayed and modules & DISCARDS_OUTPUT:
        return ("recompute modules moe_act and layernorm under FP8 delayed scaling: Megatron-LM refuses them "
                "(\"Delayed scaling does not support moe_act and layernorm recompute for fp8\")")
    return None


@dataclass(frozen=True)
class Regions:
    """What a module set checkpoints in a graph: ``region`` maps each checkpointed node to its
    region (the outermost one, a checkpoint inside another saves nothing in forward);
    ``discarded`` holds the nodes whose outputs a ``CheckpointWithoutOutput`` frees, each mapped to
    its region."""

    region: dict[str, str]
    discarded: dict[str, str]


def regions(graph: Graph, modules: frozenset[str], fused_norms: bool = True) -> Regions:
    """The checkpointed regions of ``modules`` (``core_attn`` aside: the attention core has its own
    rule) in ``graph``, remembered on it; ``fused_norms``: a dense layer's norms are fused into the
    linear after them (:attr:`~.runtime.Runtime.fuses_norms`)."""
    cache: dict[tuple[frozenset[str], bool], Regions] = graph.memo.setdefault("recompute_regions", {})
    hit = cache.get((modules, fused_norms))
    if hit is None:
        hit = cache[(modules, fused_norms)] = _regions(graph, modules, fused_norms)
    return hit


def _blocks(graph: Graph) -> dict[str, list[Node]]:
    out: dict[str, list[Node]] = {}
    for n in graph.nodes:
        tag = n.layer
        if tag is not None and n.id.startswith(tag + ".") and tag.rpartition(".")[2].isdigit():
            out.setdefault(tag, []).append(n)
    return out


def _part(n: Node, block: str) -> str:
    """``moe.experts.act`` for ``layers.3.moe.experts.act`` in block ``layers.3``."""
    return n.id[len(block) + 1:]


def _regions(graph: Graph, modules: frozenset[str], fused_norms: bool) -> Regions:
    region: dict[str, str] = {}
    discarded: dict[str, str] = {}
    for block, nodes in _blocks(graph).items():
        ops = [n for n in nodes if n.kind is not OpKind.PARAMETER]
        if "layernorm" in modules and not fused_norms:
            # TransformerLayer: CheckpointWithoutOutput around input_layernorm and pre_mlp_layernorm
            for norm in (n for n in ops if n.kind in (OpKind.LAYERNORM, OpKind.RMSNORM)):
                region[norm.id] = discarded[norm.id] = f"{block}.{_part(norm, block)}"
        dispatch = next((n for n in ops if n.kind is OpKind.DISPATCH), None)
        if dispatch is None:
            if "mlp" in modules:
                _add(region, f"{block}.mlp", _dense_mlp(graph, ops, block, fused_norms))
            continue
        norm = graph.node(dispatch.inputs[0])
        if "moe" in modules:
            _add(region, f"{block}.moe", [n for n in ops if _part(n, block).startswith("moe.")])
        elif "shared_experts" in modules:
            _add(region, f"{block}.moe.shared", [n for n in ops if _part(n, block).startswith("moe.shared.")])
        if "moe_act" in modules and "moe" not in modules:
            act = _expert_activation(graph, ops, block)
            _add(region, f"{block}.moe_act", act)
            used = {i for n in ops if n not in act for i in n.inputs}
            discarded.update({n.id: f"{block}.moe_act" for n in act if n.id in used})
        if "layernorm" in modules and norm.kind in (OpKind.LAYERNORM, OpKind.RMSNORM):
            region.setdefault(norm.id, f"{block}.pre_mlp_norm")
            discarded[norm.id] = region[norm.id]
    return Regions(region, discarded)


def _add(region: dict[str, str], name: str, nodes: list[Node]) -> None:
    for n in nodes:
        region.setdefault(n.id, name)


def _dense_mlp(graph: Graph, ops: list[Node], block: str, fused_norms: bool = True) -> list[Node]:
    """A dense layer's MLP module: its operators (the hidden dropout is the layer's bias-dropout-add,
    outside it) and, under Transformer Engine (``fused_norms``), the pre-MLP norm fused into ``linear_fc1``."""
    mlp = [n for n in ops if _part(n, block).startswith("mlp.") and n.kind is not OpKind.DROPOUT
           and n.kind not in (OpKind.LAYERNORM, OpKind.RMSNORM)]
    if not mlp or not fused_norms:
        return mlp
    ids = {n.id for n in mlp}
    norms = {i for n in mlp for i in n.inputs if i not in ids and graph.node(i).kind in (OpKind.LAYERNORM,
                                                                                        OpKind.RMSNORM)}
    return [graph.node(i) for i in sorted(norms)] + mlp


def _expert_activation(graph: Graph, ops: list[Node], block: str) -> list[Node]:
    """The experts' activation function between ``linear_fc1`` and ``linear_fc2``: the elementwise
    operators (bias, SiLU, product) ``linear_fc2``'s input is made of."""
    experts = {n.id: n for n in ops if _part(n, block).startswith("moe.experts.")}
    found: dict[str, Node] = {}
    for n in experts.values():
        if n.kind is not OpKind.EINSUM:
            continue
        todo = [i for i in n.inputs if i in experts and experts[i].kind is OpKind.ELEMENTWISE]
        while todo:
            x = experts[todo.pop()]
            if x.id not in found:
                found[x.id] = x
                todo += [i for i in x.inputs if i in experts and experts[i].kind is OpKind.ELEMENTWISE]
    return [n for n in ops if n.id in found]

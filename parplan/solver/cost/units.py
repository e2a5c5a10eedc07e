"""Costs per *unit* (a layer tag: ``embed``, ``layers.3``, ``head``), computed once per distinct unit.

A transformer repeats one block tens of times; every strategy evaluation would otherwise walk every
operator of every block. :class:`GraphCosts` analyses the graph once — which units are structurally
identical, which parameters and saved tensors several units share — and then prices a unit under
a per-unit strategy (:class:`UnitStrategy`) once per distinct structure. Plans (uniform or
per-layer, as the DP search builds) are sums of unit costs plus the shared items, counted once per
pipeline stage that needs them.

Everything here is a rearrangement of the per-operator models in :mod:`.activations`,
:mod:`.memory`, :mod:`.compute` and :mod:`.collectives`; no new cost assumptions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from parplan.solver.calibration import Calibration
from parplan.solver.cluster import GpuSpec, Link
from parplan.solver.cost.activations import (
    SCATTERED,
    UNREDUCED,
    Recompute,
    SavedItem,
    block_of,
    loss_backward_bytes_per_logit,
    module_rebuilt_items,
    saved_items,
)
from parplan.solver.cost.backward import (
    BackwardProfile,
    UnitSizes,
    attention_bytes,
    backward_profile,
    forward_transient,
)
from parplan.solver.cost.context_parallel import AttentionBytes, cp_buffer_bytes, cp_exchange
from parplan.solver.cost.layout import TensorLayout
from parplan.solver.cost.loss_loop import LossLoop, loss_loop
from parplan.solver.cost.op_layout import (
    OpStrategy,
)
from parplan.solver.cost.pipeline import units_of
from parplan.solver.cost.precision import Precision
from parplan.solver.cost.rules import float8_weight, op_seconds, unit_parameter_numel
from parplan.solver.cost.runtime import Runtime
from parplan.solver.cost.unit_comm import token_all_to_all_seconds, tp_comm_seconds
from parplan.solver.cost.unit_strategy import (
    UnitStrategy,
    local_elems,
    mesh_sizes,
    op_mesh,
    uniform_strategy,
    unit_layout,
    weight_grad_workspace,
)
from parplan.solver.ir import Graph, Node, OpKind
from parplan.solver.strategy import SEQ_DIMS


@dataclass(frozen=True)
class ParamGroup:
    """Parameter elements one device holds (before ZeRO), grouped by how they replicate."""

    tp_replicated: bool  # not split by TP, so every TP rank holds a copy
    expert: bool  # split over the expert-parallel axis (ZeRO shards them over the rest of DP)


#: the axes inside a TP group: the tensor axis, and the experts' two factors of it under an expert
#: tensor-parallel degree of their own (:func:`~.unit_strategy.mesh_sizes`)
TP_GROUP_AXES = ("tp", "etp", "etx")


def param_group(lay: TensorLayout, s: UnitStrategy) -> ParamGroup:
    """How a parameter in layout ``lay`` replicates: an expert's (split over the expert axis) over its
    expert tensor-parallel group when no tensor axis splits it, any other over the TP group."""
    expert = "ep" in lay.axes
    ranks = (s.etp or s.tp) if expert else s.tp
    return ParamGroup(tp_replicated=ranks > 1 and not lay.axes & {"tp", "etp"}, expert=expert)


@dataclass(frozen=True)
class OwnedParam:
    """A parameter an operator reads first in its unit: its gradient is synchronised once per step,
    overlapped with that operator's backward."""

    id: str
    group: ParamGroup
    elems: float  # local elements, before ZeRO
    shared: bool  # read by several units (a tied embedding): synchronised once per stage
    tp_partial: bool  # replicated over TP by an operator whose work TP splits: its gradient is all-reduced over TP
    numel: float  # whole-tensor elements
    float8: bool = False  # a Float8 linear layer's weight (rules.float8_weight)


@dataclass(frozen=True)
class OwnerOp:
    """An operator's forward and backward seconds (one micro-batch; the backward pass's, its
    recomputed forward included) and the parameters it owns."""

    forward_seconds: float
    backward_seconds: float
    params: tuple[OwnedParam, ...]


@dataclass
class UnitCost:
    """Per-device costs of one unit under one :class:`UnitStrategy` (one micro-batch where it applies)."""

    params: dict[ParamGroup, float] = field(default_factory=dict)  # local elements, shared params excluded
    param_elems_all: float = 0.0  # every parameter the unit uses (ZeRO-3 gathers them all)
    param_gathered_bytes: float = 0.0  # those gathered, unsharded (Precision.gathered_bytes)
    param_numel: float = 0.0  # whole-tensor elements of the distinct parameters the unit reads
    largest_param_elems: float = 0.0  # the largest parameter tensor on one device
    grad_workspace_bytes: float = 0.0  # a weight gradient and its input's gradient, before accumulation
    act_bytes: float = 0.0  # saved for backward, shared items excluded
    act_redundant_bytes: float = 0.0
    recompute_peak_bytes: float = 0.0  # rebuilt in backward (full recompute: the block; a module set: its modules)
    logits_grad_bytes: float = 0.0
    sp_gather_bytes: float = 0.0
    cp_buffer_bytes: float = 0.0  # context parallelism: the exchange's buffers in an attention's backward
    forward_seconds: float = 0.0
    backward_seconds: float = 0.0
    recompute_seconds: float = 0.0
    tp_comm_seconds: float = 0.0
    ep_comm_seconds: float = 0.0  # expert parallelism: the tokens' all-to-alls to their experts and back
    cp_comm_seconds: float = 0.0  # context parallelism: the exchange (ring or all-to-all) compute does not hide
    matmul_seconds: float = 0.0  # forward, backward, recompute of GEMMs with a weight (TP overlap hides under them)
    #: of the backward, the weight gradients of the GEMMs with a weight: half their backward (its two GEMMs,
    #: input and weight gradient, each of the forward's FLOPs); a zero-bubble schedule's W
    weight_grad_seconds: float = 0.0
    owners: list[OwnerOp] = field(default_factory=list)  # with time: operators owning parameters, in order


@dataclass(frozen=True)
class TimeEnv:
    """Hardware a unit's time depends on."""

    gpu: GpuSpec
    calibration: Calibration
    precision: Precision
    tp_link: Link | None
    cp_link: Link | None = None  # the context-parallel ring's slowest hop (cp > 1)
    cp_group_link: Link | None = None  # the context-parallel group's link for its all-to-alls
    ep_link: Link | None = None  # the expert-parallel group's link for its all-to-alls (ep > 1)


class OperatorSeconds(NamedTuple):
    """One operator's strategy and its seconds of one micro-batch on one device."""

    node: Node
    strategy: OpStrategy
    forward: float
    backward: float
    recompute: float


class GraphCosts:
    """One graph's unit structure, and a cache of unit costs per strategy.

    Units are the graph's layer tags; two units are *alike* when their operators, shapes and
    wiring match (names aside), and then cost the same under every strategy.
    """

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.units = units_of(graph)
        self.param_numel = unit_parameter_numel(graph)  # by unit, as the ILP counts them
        self.nodes: dict[str, list[Node]] = {u: [] for u in self.units}
        for n in graph.nodes:
            if not n.is_parameter:
                self.nodes.setdefault(n.layer or "", []).append(n)
        self.params: dict[str, list[Node]] = {}
        users: dict[str, set[str]] = {}
        for u, nodes in self.nodes.items():
            seen: dict[str, Node] = {}
            for n in nodes:
                for i in n.inputs:
                    p = graph.node(i)
                    if p.is_parameter:
                        seen.setdefault(p.id, p)
                        users.setdefault(p.id, set()).add(u)
            self.params[u] = list(seen.values())
        self.shared_params = {p for p, us in users.items() if len(us) > 1}
        #: units that use a shared parameter: the only ones the stage-level shared pieces depend on
        self.param_sharing = frozenset(u for u, ps in self.params.items() if any(p.id in self.shared_params
                                                                                  for p in ps))
        self._stage_pieces: dict[Hashable, Any] = {}
        #: distinct unit costs priced so far (a work count)
        self.pricings = 0
        #: (cluster, calibration, evaluator) of uniform strategies on this graph (see plan_evaluator)
        self.evaluators: list[tuple[Any, Any, Any]] = []
        self.unit_of = {n.id: n.layer or "" for n in graph.nodes}
        self.external_inputs: dict[str, list[str]] = {}
        for u, nodes in self.nodes.items():
            ext: dict[str, None] = {}
            for n in nodes:
                for i in n.inputs:
                    src = graph.node(i)
                    if self.unit_of[i] != u and not src.is_parameter and src.kind is not OpKind.INPUT:
                        ext.setdefault(i, None)
            self.external_inputs[u] = list(ext)
        self.consumers = graph.consumers()
        #: the weights of the linear layers torchao's Float8 training converts (rules.float8_weight)
        self.float8_params = frozenset(p.id for p in graph.parameters()
                                       if float8_weight(p, graph, self.consumers[p.id]))
        signatures: dict[Hashable, str] = {}
        structures: dict[Hashable, str] = {}
        self.representative: dict[str, str] = {}
        #: unit -> the first unit with the same operators, shapes and wiring, however their outputs
        #: are used outside (coarser than ``representative``: the last block, feeding the head, is
        #: structurally alike the others but saves different buffers)
        self.structural_representative: dict[str, str] = {}
        for u in self.nodes:
            self.representative[u] = signatures.setdefault(self._signature(u), u)
            self.structural_representative[u] = structures.setdefault(self._signature(u, uses=False), u)
        self._items: dict[tuple[Recompute, bool, int, Runtime, bool],
                          tuple[dict[str, list[SavedItem]], set[str]]] = {}
        self._costs: dict[tuple[str, UnitStrategy, Precision, TimeEnv | None], UnitCost] = {}
        self._profiles: dict[tuple[str, UnitStrategy, Precision], BackwardProfile] = {}
        self._forward: dict[tuple[str, UnitStrategy, Precision], float] = {}
        self._loops: dict[tuple[str, UnitStrategy, Precision], LossLoop | None] = {}

    def node_representatives(self, structural: bool = False) -> dict[str, str]:
        """Node id -> the node at the same position of its unit's representative
        (``structural``: of the first unit alike in its own operators, however its outputs are used)."""
        reps = self.structural_representative if structural else self.representative
        out: dict[str, str] = {}
        for u, nodes in self.nodes.items():
            for n, r in zip(nodes, self.nodes[reps[u]], strict=True):
                out[n.id] = r.id
        return out

    # ------------------------------------------------------------------ analysis
    def _signature(self, unit: str, uses: bool = True) -> Hashable:
        local = {n.id: k for k, n in enumerate(self.nodes[unit])}
        plocal = {p.id: k for k, p in enumerate(self.params[unit])}
        sig: list[Any] = [tuple((p.dims, p.id in self.shared_params) for p in self.params[unit])]
        for n in self.nodes[unit]:
            refs: list[tuple[Any, ...]] = []
            for i in n.inputs:
                if i in local:
                    refs.append(("n", local[i]))
                elif i in plocal:
                    refs.append(("p", plocal[i]))
                else:
                    src = self.graph.node(i)
                    # what made an outside input decides its layout, so what converting it costs
                    # (the first block's input is the embedding's partial sums, the next's is not)
                    made = (src.kind.value, _freeze(src.attrs), src.kind is OpKind.INPUT) if uses else ()
                    refs.append(("x", src.dims, src.dtype, made))
            # how the output is used outside the unit decides what is saved for it (a block whose
            # output only feeds a view differs from one whose output feeds the next block's matmuls)
            outside = tuple(sorted((c.kind.value, str(c.attrs.get("fn", "")), c.inputs.index(n.id))
                                   for c in map(self.graph.node, self.consumers[n.id]) if c.id not in local)
                            ) if uses else ()
            sig.append((n.kind.value, n.dims, n.dtype, _freeze(n.attrs), tuple(refs), block_of(n) is None, outside))
        return tuple(sig)

    def saved(self, recompute: Recompute, flash: bool, act_bytes: int, runtime: Runtime = Runtime.MEGATRON,
              fp8_inputs: bool = False) -> tuple[dict[str, list[SavedItem]], set[str]]:
        """Saved items per unit, and the keys that several units save (counted once per stage)."""
        key = (recompute, flash, act_bytes, runtime, fp8_inputs)
        if key not in self._items:
            per_unit: dict[str, list[SavedItem]] = {}
            savers: dict[str, set[str]] = {}
            for u, nodes in self.nodes.items():
                items = list(saved_items(self.graph, nodes, act_bytes, flash_attention=flash, recompute=recompute,
                                         runtime=runtime, fp8_inputs=fp8_inputs))
                per_unit[u] = items
                for it in items:
                    savers.setdefault(it.key, set()).add(u)
            shared = {k for k, us in savers.items() if len(us) > 1}
            self._items[key] = (per_unit, shared)
        return self._items[key]

    # ------------------------------------------------------------------ pricing
    def unit_cost(self, unit: str, s: UnitStrategy, precision: Precision, env: TimeEnv | None = None) -> UnitCost:
        """Costs of ``unit`` under ``s`` (memory always; time when ``env`` is given)."""
        rep = self.representative[unit]
        key = (rep, s, precision, env)
        cost = self._costs.get(key)
        if cost is None:
            self.pricings += 1
            cost = self._price(rep, s, precision, env)
            self._costs[key] = cost
        return cost

    def backward_profile(self, unit: str, s: UnitStrategy, precision: Precision) -> BackwardProfile:
        """What ``unit`` holds at the busiest moment of its backward (see :mod:`.backward`)."""
        key = (self.representative[unit], s, precision)
        if key not in self._profiles:
            shared = self.saved(s.recompute, s.flash_attention, precision.activation_bytes, s.runtime,
                                precision.te_fp8)[1]
            self._profiles[key] = backward_profile(self, key[0], s, precision, shared)
        return self._profiles[key]

    def forward_transient(self, unit: str, s: UnitStrategy, precision: Precision) -> float:
        """Bytes ``unit``'s forward holds at once beyond what it saves (see :mod:`.backward`)."""
        key = (self.representative[unit], s, precision)
        if key not in self._forward:
            self._forward[key] = forward_transient(self, key[0], s, precision)
        return self._forward[key]

    def loss_loop(self, unit: str, s: UnitStrategy, precision: Precision) -> LossLoop | None:
        """The chunked loss's loop run by ``unit``'s forward, None without one (see :mod:`.loss_loop`)."""
        key = (self.representative[unit], s, precision)
        if key not in self._loops:
            act = precision.activation_bytes
            self._loops[key] = loss_loop(self.graph, self.nodes[key[0]], UnitSizes(self.graph, s, act), s.runtime, act)
        return self._loops[key]

    def _price(self, unit: str, s: UnitStrategy, prec: Precision, env: TimeEnv | None) -> UnitCost:
        mesh = mesh_sizes(s)
        c = UnitCost(param_numel=self.param_numel.get(unit, 0.0))
        for p in self.params[unit]:
            lay = unit_layout(p, s)
            local = p.numel / lay.shards(mesh)
            c.param_elems_all += local
            c.param_gathered_bytes += local * prec.gathered_bytes(p.id in self.float8_params)
            c.largest_param_elems = max(c.largest_param_elems, local)
            if p.id in self.shared_params:
                continue
            group = param_group(lay, s)
            c.params[group] = c.params.get(group, 0.0) + local
        per_unit, shared = self.saved(s.recompute, s.flash_attention, prec.activation_bytes, s.runtime, prec.te_fp8)
        c.act_bytes, c.act_redundant_bytes = self.item_bytes((it for it in per_unit[unit] if it.key not in shared), s)
        nodes = self.nodes[unit]
        if nodes and s.recompute.rebuilds_blocks and block_of(nodes[0]) is not None:
            # backward re-runs the block's forward as if nothing were checkpointed (same attention kernel)
            inner = saved_items(self.graph, nodes, prec.activation_bytes, flash_attention=s.flash_attention,
                                recompute=Recompute.NONE, runtime=s.runtime, fp8_inputs=prec.te_fp8)
            c.recompute_peak_bytes = self.item_bytes(inner, s)[0]
        elif nodes and s.recompute.per_module:
            c.recompute_peak_bytes = self.item_bytes(module_rebuilt_items(
                self.graph, nodes, prec.activation_bytes, flash_attention=s.flash_attention, recompute=s.recompute,
                runtime=s.runtime, fp8_inputs=prec.te_fp8), s)[0]
        for n in nodes:
            if n.kind not in (OpKind.EINSUM, OpKind.EMBEDDING):
                continue
            ins = [self.graph.node(i) for i in n.inputs]
            weights = [x for x in ins if x.is_parameter]
            acts = [x for x in ins if not x.is_parameter and x.kind is not OpKind.INPUT]
            if not weights:
                continue
            wgrad = sum(weight_grad_workspace(n, w, s) for w in weights) * prec.grad_bytes
            igrad = sum(a.numel / unit_layout(a, s).shards(mesh) for a in acts) * prec.activation_bytes
            c.grad_workspace_bytes = max(c.grad_workspace_bytes, wgrad + igrad)
        for n in nodes:
            if n.kind is OpKind.CROSS_ENTROPY:
                logits = self.graph.node(n.inputs[0])
                lay = unit_layout(logits, s)
                sharded = lay.shards(mesh, [str(n.attrs.get("class_dim", "vocab"))]) > 1
                per_elem = loss_backward_bytes_per_logit(s.runtime, sharded, prec.activation_bytes)
                c.logits_grad_bytes = max(c.logits_grad_bytes, logits.numel * per_elem / lay.shards(mesh))
            if s.sp and n.kind in (OpKind.LAYERNORM, OpKind.RMSNORM) and block_of(n) is not None:
                c.sp_gather_bytes = max(c.sp_gather_bytes, n.numel * prec.activation_bytes / s.cp)
            if s.cp > 1 and n.kind is OpKind.ATTENTION:
                c.cp_buffer_bytes = max(c.cp_buffer_bytes,
                                        cp_buffer_bytes(s.cp_comm, self.attention_bytes(n, s, prec), True))
        if env is not None:
            self._price_time(unit, s, env, c)
        return c

    def item_bytes(self, items: Iterable[SavedItem], s: UnitStrategy) -> tuple[float, float]:
        """(bytes, redundant bytes) of saved items on one device, deduplicated by key."""
        mesh = mesh_sizes(s)
        seen: set[str] = set()
        held = redundant = 0.0
        for it in items:
            if it.key in seen:
                continue
            seen.add(it.key)
            owner = self.graph.node(it.owner)
            lay = unit_layout(owner, s)
            scattered = any("tp" in a for d, a in lay.split if d in SEQ_DIMS)  # reduce-scattered over TP
            if it.reduction == SCATTERED and not scattered:
                continue  # no reduce-scatter made it (an all-reduce's output is not kept)
            if it.reduction == UNREDUCED or (s.sp and s.runtime.saves_gathered_sp_inputs and it.key == owner.id
                                             and owner.kind in (OpKind.LAYERNORM, OpKind.RMSNORM)):
                # a matmul's partial sums before their reduce-scatter; a norm's output, saved by the
                # column-parallel linears it feeds, all-gathered
                lay = TensorLayout(tuple((d, tuple(x for x in a if x != "tp") if d in SEQ_DIMS else a)
                                         for d, a in lay.split), lay.partial)
            local = it.total_bytes / lay.shards(mesh, it.dims)
            held += local
            if s.tp > 1:  # the copies the TP group holds of it
                split = math.prod(mesh[a] for _, axes in lay.split for a in axes if a in TP_GROUP_AXES)
                redundant += local * (1 - split / s.tp)
        return held, redundant

    def operator_seconds(self, unit: str, s: UnitStrategy, env: TimeEnv) -> Iterator[OperatorSeconds]:
        """Each operator of ``unit`` with its strategy and its (forward, backward, recomputed
        forward) seconds of one micro-batch on one device: the terms :meth:`unit_cost` adds up."""
        for n in self.nodes[unit]:
            if n.kind is OpKind.INPUT:
                continue
            op = uniform_strategy(n, self.graph, s)
            f, b, r = op_seconds(n, self.graph, env.gpu, env.calibration, env.precision, op, op_mesh(s),
                                 s.recompute, s.flash_attention, s.runtime)
            yield OperatorSeconds(n, op, f, b, r)

    def _price_time(self, unit: str, s: UnitStrategy, env: TimeEnv, c: UnitCost) -> None:
        mesh = mesh_sizes(s)
        prec = env.precision
        act = prec.activation_bytes
        graph = self.graph
        seen: set[str] = set()
        for n, op, f, b, r in self.operator_seconds(unit, s, env):
            c.forward_seconds += f
            c.backward_seconds += b
            c.recompute_seconds += r
            if n.kind is OpKind.EINSUM and any(graph.node(i).is_parameter for i in n.inputs):
                c.matmul_seconds += f + b + r
                c.weight_grad_seconds += b / 2
            if s.cp > 1 and n.kind is OpKind.ATTENTION and env.cp_link is not None:
                exchange = cp_exchange(s.cp_comm, s.cp, self.attention_bytes(n, s, prec), f, b, env.cp_link,
                                       env.cp_group_link or env.cp_link, recomputed=r > 0)
                c.cp_comm_seconds += exchange.exposed_seconds
            owned = []
            for i in dict.fromkeys(n.inputs):
                p = graph.node(i)
                if not p.is_parameter or p.id in seen:
                    continue
                seen.add(p.id)
                lay = unit_layout(p, s)
                group = param_group(lay, s)
                replicated = group.tp_replicated
                owned.append(OwnedParam(p.id, group,
                                        p.numel / lay.shards(mesh), p.id in self.shared_params,
                                        replicated and op.assignment[0] is not None, float(p.numel),
                                        p.id in self.float8_params))
            if owned:
                c.owners.append(OwnerOp(f, b + r, tuple(owned)))
        if s.tp > 1 and env.tp_link is not None:
            c.tp_comm_seconds = tp_comm_seconds(self.graph, self.nodes[unit], s, env.tp_link, act, env.cp_link)
        if s.ep > 1 and env.ep_link is not None:
            c.ep_comm_seconds = token_all_to_all_seconds(self.graph, self.nodes[unit], s, env.ep_link, act)

    def attention_bytes(self, n: Node, s: UnitStrategy, prec: Precision) -> AttentionBytes:
        """What one rank holds of attention ``n``'s q, k and v, and output (see :mod:`.context_parallel`)."""
        return attention_bytes(n, UnitSizes(self.graph, s, prec.activation_bytes), prec.activation_bytes)

    # ------------------------------------------------------------------ shared pieces of a stage
    def sharing(self, units: Iterable[str]) -> tuple[str, ...]:
        """Those of ``units`` (in order) that use a parameter several units share: what the shared
        pieces of a stage (:meth:`shared_param_elems`, :meth:`tied_within`, ...) depend on."""
        return tuple(u for u in units if u in self.param_sharing)

    def shared_param_elems(self, units: Iterable[str], s: UnitStrategy) -> dict[ParamGroup, float]:
        """Local elements of the parameters several units share, once for the given units."""
        sharing = self.sharing(units)
        key = ("shared_param_elems", sharing, s)
        if key not in self._stage_pieces:
            self._stage_pieces[key] = self._shared_param_elems(sharing, s)
        return dict(self._stage_pieces[key])

    def _shared_param_elems(self, units: Iterable[str], s: UnitStrategy) -> dict[ParamGroup, float]:
        mesh = mesh_sizes(s)
        out: dict[ParamGroup, float] = {}
        seen: set[str] = set()
        for u in units:
            for p in self.params[u]:
                if p.id in self.shared_params and p.id not in seen:
                    seen.add(p.id)
                    lay = unit_layout(p, s)
                    g = param_group(lay, s)
                    out[g] = out.get(g, 0.0) + p.numel / lay.shards(mesh)
        return out

    def tied_within(self, units: Iterable[str], s: UnitStrategy) -> float:
        """Local elements of the parameters two or more of ``units`` use (a tied embedding on a stage
        that holds both the embedding and the LM head), each once."""
        sharing = self.sharing(units)
        key = ("tied_within", sharing, s)
        if key not in self._stage_pieces:
            self._stage_pieces[key] = sum(local_elems(p, s) for p in self._tied(list(sharing)))
        out: float = self._stage_pieces[key]
        return out

    def tied_ids(self, units: Iterable[str]) -> set[str]:
        """Parameters two or more of ``units`` use (a tied embedding on a stage with both uses)."""
        sharing = self.sharing(units)
        key = ("tied_ids", sharing)
        if key not in self._stage_pieces:
            self._stage_pieces[key] = frozenset(p.id for p in self._tied(list(sharing)))
        return set(self._stage_pieces[key])

    def tied_gradient_workspace(self, units: Iterable[str], s: UnitStrategy) -> float:
        """The largest gradient (elements) that one operator of ``units`` makes for a parameter two
        of them share (the embedding's backward for a tied table)."""
        sharing = self.sharing(units)  # only units using a shared parameter read a tied one
        key = ("tied_gradient_workspace", sharing, s)
        if key not in self._stage_pieces:
            tied = {p.id for p in self._tied(list(sharing))}
            out = 0.0
            for u in sharing:
                for n in self.nodes[u]:
                    for i in n.inputs:
                        if i in tied:
                            out = max(out, weight_grad_workspace(n, self.graph.node(i), s))
            self._stage_pieces[key] = out
        cached: float = self._stage_pieces[key]
        return cached

    def _tied(self, units: list[str]) -> list[Node]:
        uses: dict[str, int] = {}
        nodes: dict[str, Node] = {}
        for u in units:
            for p in self.params[u]:
                if p.id in self.shared_params:
                    uses[p.id] = uses.get(p.id, 0) + 1
                    nodes[p.id] = p
        return [nodes[p] for p, n in uses.items() if n > 1]

    def shared_item_bytes(self, units: Iterable[str], s: UnitStrategy, act_bytes: int,
                          fp8_inputs: bool = False) -> tuple[float, float]:
        """Saved buffers several units share, counted once for the given units."""
        per_unit, shared = self.saved(s.recompute, s.flash_attention, act_bytes, s.runtime, fp8_inputs)
        savers = self._item_sharing(s.recompute, s.flash_attention, act_bytes, s.runtime, fp8_inputs)
        sharing = tuple(u for u in units if u in savers)  # the others save nothing shared
        key = ("shared_item_bytes", sharing, s, act_bytes, fp8_inputs)
        if key not in self._stage_pieces:
            items = (it for u in sharing for it in per_unit[u] if it.key in shared)
            self._stage_pieces[key] = self.item_bytes(items, s)
        held, redundant = self._stage_pieces[key]
        return held, redundant

    def _item_sharing(self, recompute: Recompute, flash: bool, act_bytes: int, runtime: Runtime,
                      fp8_inputs: bool) -> frozenset[str]:
        """Units saving an item another unit saves too."""
        key = ("item_sharing", recompute, flash, act_bytes, runtime, fp8_inputs)
        if key not in self._stage_pieces:
            per_unit, shared = self.saved(recompute, flash, act_bytes, runtime, fp8_inputs)
            self._stage_pieces[key] = frozenset(u for u, items in per_unit.items()
                                                if any(it.key in shared for it in items))
        out: frozenset[str] = self._stage_pieces[key]
        return out

    def boundary_bytes(self, units: Iterable[str], stage_of_unit: Callable[[str], int], stage: int,
                       s: UnitStrategy, act_bytes: int) -> list[float]:
        """Per-device bytes of each tensor a stage receives from another stage."""
        mesh = mesh_sizes(s)
        out: list[float] = []
        seen: set[str] = set()
        for u in units:
            for i in self.external_inputs[u]:
                if i in seen or stage_of_unit(self.unit_of[i]) == stage:
                    continue
                seen.add(i)
                src = self.graph.node(i)
                out.append(src.numel * act_bytes / unit_layout(src, s).shards(mesh))
        return out


def _freeze(value: Any) -> Hashable:
    if isinstance(value, dict) or hasattr(value, "items"):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value  # type: ignore[no-any-return]

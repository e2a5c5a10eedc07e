"""Run an ILP plan — one sharding strategy per operator — with DTensor, and measure it.

The ILP's plans are not Megatron-style degrees but a layout per operator on a device mesh
(:mod:`parplan.solver.ilp.strategies`). This module executes such a plan as it is written: the
operator graph of the model is interpreted node by node on DTensors over a
:func:`~torch.distributed.device_mesh.init_device_mesh` mesh of the plan's shape, and for every
operator

- each input is redistributed to the layout the operator's strategy needs (slicing, all-gather,
  all-to-all, reduce-scatter or all-reduce, as DTensor's ``redistribute`` chooses for the pair of
  placements; on gloo, where DTensor has no all-to-all, :mod:`.alltoall` does that exchange);
- the operator runs on those DTensors (DTensor's own sharding propagation computes the local
  part; a split contracted dim leaves partial sums);
- its output is redistributed to the layout the strategy gives it.

A layout maps to placements per mesh axis: ``Shard(i)`` when the axis splits the tensor's ``i``-th
dim (a dim split over two axes is sharded on both, outer axis first), ``Partial()`` for pending
sums, ``Replicate()`` otherwise. Parameters live in their owner's layout; with ZeRO-3 they are also
sharded over the strategy's data axes and all-gathered where used (their gradients come back
reduce-scattered). ZeRO-1/2 are not executed (plans for the agent are searched with ZeRO 0 or 3).

Operators supported: the GPT and Llama families' as the builder writes them (embedding, einsum,
elementwise add / multiply / GELU / SiLU, dropout, LayerNorm and RMSNorm over the last dim, causal
attention with grouped-query heads through PyTorch's fused kernel, cross entropy), and what a traced
Hugging Face graph adds (:mod:`.graph_ops`: broadcasting by name, reshape, concat, select / mean
reductions, softmax, attention with a mask input; :mod:`.moe_exec`: MoE dispatch and combine, with
expert parallelism over an all-to-all). A traced graph travels in the spec as its wire document.
RMSNorm keeps ``x`` and ``rstd`` for backward, as fused GPU kernels do (PyTorch's CPU composite
would also keep ``x·rstd``), and a vocabulary-split embedding looks up its own rows only: the cost
model prices these runs with ``Runtime.INTERPRETER_CPU``. Cross entropy gathers split logits (no
vocabulary-parallel loss). The reference is the same interpreter on plain tensors in one process.

:mod:`.plan_interpreter` runs the graph and :mod:`.local_ops` its operators on local tensors; this
module reads the plan, and runs and checks it on each rank.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from parplan.agent.executor import device_for_rank, summarise_contents
from parplan.agent.memtrack import CategoryTracker
from parplan.agent.plan_interpreter import ParameterHolder, PlanInterpreter
from parplan.solver.cost.op_layout import renaming
from parplan.solver.cost.units import GraphCosts
from parplan.solver.errors import StrategyError
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.ilp.strategies import Mesh
from parplan.solver.ir import Graph
from parplan.solver.wire import graph_from_json


@dataclass
class IlpRunSpec:
    """What the ranks run: the model, the micro-step, the mesh and every operator's strategy."""

    model: dict[str, Any]  # TransformerConfig fields ({} when ``graph_doc`` gives the graph)
    batch: int  # samples per micro-step (over the whole mesh)
    seq_len: int
    mesh: list[int]  # axis sizes, outermost first
    strategies: dict[str, dict[str, Any]]  # op id -> {"assignment": [dim or None per axis], "zero": int}
    seed: int = 0
    label: str = ""
    diagnose: bool = False  # also report what was alive at each category's peak
    extra: dict[str, Any] = field(default_factory=dict)
    graph_doc: dict[str, Any] | None = None  # a traced graph's wire document, built for ``batch``

    @property
    def world(self) -> int:
        return math.prod(self.mesh)

    def config(self) -> TransformerConfig:
        return TransformerConfig(**self.model)

    def graph(self) -> Graph:
        if self.graph_doc is not None:
            return graph_from_json(self.graph_doc)
        return build_graph(self.config(), batch=self.batch, seq_len=self.seq_len)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def strategies_from_plan(plan: Mapping[str, Any], graph: Graph) -> dict[str, dict[str, Any]]:
    """Every operator's strategy from an ILP plan document (``strategy.units[].ops`` name the
    operators of each group's representative unit; the other units of a group take the same
    strategy at the same position)."""
    strategy = plan.get("strategy") or {}
    if strategy.get("kind") != "intra-operator":
        raise StrategyError("not an ILP plan (strategy.kind is not 'intra-operator')")
    names = list((strategy.get("mesh") or {}).get("axes") or {})
    by_rep: dict[str, dict[str, Any]] = {}
    for group in strategy.get("units") or []:
        for op, entry in (group.get("ops") or {}).items():
            if "assignment" in entry:
                assignment = [entry["assignment"].get(a) for a in names]
                by_rep[op] = {"assignment": assignment, "zero": int(entry.get("zero", 0))}
    rep_of = GraphCosts(graph).node_representatives(structural=True)  # as the ILP shares its variables
    out: dict[str, dict[str, Any]] = {}
    for n in graph.nodes:
        if n.is_leaf:
            continue
        rep = rep_of[n.id]
        if rep in by_rep:
            out[n.id] = by_rep[rep]
            continue
        names_of = renaming(graph, n)
        producer = out.get(n.inputs[0]) if n.inputs else None
        if names_of is None or producer is None:
            raise StrategyError(f"the plan gives no strategy for operator {n.id} (representative {rep})")
        # a view that only renames dims follows its producer's layout (the ILP gives it no variables)
        out[n.id] = {"assignment": [names_of.get(d, d) if d is not None else None for d in producer["assignment"]],
                     "zero": 0}
    return out


def reference_loss_and_grads(spec: IlpRunSpec) -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and gradients of the micro-step in one process, plain tensors, dropout off."""
    graph = spec.graph()
    ref = PlanInterpreter(graph, None, None)
    holder = ParameterHolder(ref.parameters(spec.seed))
    loss = ref.loss(holder.as_dict(), ref.inputs(spec.seed), dropout=False)
    loss.backward()
    return float(loss.item()), {n: p.grad.detach().clone() for n, p in holder.as_dict().items() if p.grad is not None}


def run_ilp_spec(spec: IlpRunSpec, device: torch.device) -> dict[str, Any]:
    """On this rank (inside a process group of ``spec.world`` ranks): a correctness check against
    the single-process reference, one warm-up step, then one measured training step (forward,
    backward, Adam) under the category tracker."""
    if dist.get_world_size() != spec.world:
        raise StrategyError(f"the plan's mesh has {spec.world} devices but the process group {dist.get_world_size()}")
    graph = spec.graph()
    mesh = Mesh(tuple((f"m{i}", s) for i, s in enumerate(spec.mesh)))
    dm = init_device_mesh(device.type, tuple(spec.mesh), mesh_dim_names=mesh.names)
    runner = PlanInterpreter(graph, spec.strategies, mesh, dm)
    holder = ParameterHolder(runner.parameters(spec.seed))
    inputs = runner.inputs(spec.seed)
    # correctness: step-1 loss and every gradient against one process, dropout off
    loss = runner.loss(holder.as_dict(), inputs, dropout=False)
    loss.backward()
    ref_loss, ref_grads = reference_loss_and_grads(spec)
    got_loss = float((loss.full_tensor() if hasattr(loss, "full_tensor") else loss).item())
    mismatches = []
    worst = 0.0
    for name, p in holder.as_dict().items():
        g = p.grad.full_tensor() if p.grad is not None else torch.zeros_like(ref_grads[name])
        worst = max(worst, float((g - ref_grads[name]).abs().max()))
        if not torch.allclose(g, ref_grads[name], rtol=1e-4, atol=1e-6):
            mismatches.append(name)
    check = {"ok": not mismatches and math.isclose(got_loss, ref_loss, rel_tol=1e-5), "loss": got_loss,
             "reference_loss": ref_loss, "max_abs_grad_diff": worst, "mismatches": mismatches,
             "parameters_compared": len(ref_grads), "rtol": 1e-4, "atol": 1e-6}
    optimizer = torch.optim.Adam(holder.parameters(), lr=1e-3, foreach=False)

    def step() -> None:
        optimizer.zero_grad(set_to_none=False)
        runner.loss(holder.as_dict(), inputs, dropout=True).backward()
        optimizer.step()

    step()  # warm-up: gradients and optimizer states exist from here on
    dist.barrier()
    tracker = CategoryTracker(diagnose=spec.diagnose)
    tracker.register_state([holder], [optimizer])
    with tracker.measuring():
        step()
    measured = tracker.result(device)
    if spec.diagnose:
        measured["contents"] = {k: summarise_contents(v) for k, v in tracker.peak_contents.items()}
    return {"rank": dist.get_rank(), "label": spec.label, "device": device.type, "check": check,
            "measured": measured}


def run_ilp_specs(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Worker entry point: every spec in turn on this rank."""
    device = device_for_rank()
    out = []
    for d in specs:
        out.append(run_ilp_spec(IlpRunSpec(**d), device))
        dist.barrier()
    return out

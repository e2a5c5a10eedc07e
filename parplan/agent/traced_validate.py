"""Validate plans of traced Hugging Face models: tensor parallelism on a tiny Qwen2, expert
parallelism on a tiny Qwen2-MoE.

The config is traced into a graph (:func:`~parplan.solver.frontends.hf_trace.trace_hf_config`,
even where a hand-written mapper exists), every operator gets an explicit strategy on a 1-D mesh
(:func:`tensor_parallel_strategies`, :func:`expert_parallel_strategies`), the plan interpreter
(:mod:`parplan.agent.ilp_exec`) runs it on ``mesh`` local processes in fp32 and checks loss and
gradients against one process, and each rank's measured peak is compared with the ILP cost
model's prediction of the same strategies (:func:`~parplan.agent.ilp_validate.predicted_graph_memory`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from parplan.agent.ilp_exec import IlpRunSpec
from parplan.agent.ilp_validate import as_executed, predicted_graph_memory, run_and_compare_spec
from parplan.agent.plan_interpreter import check_graph
from parplan.solver.cost.op_layout import uniform_assignment
from parplan.solver.ilp.strategies import BATCH_DIMS, Mesh, loop_dims
from parplan.solver.ir import Graph, OpKind
from parplan.solver.objective import DEFAULT_MAX_SLOWDOWN
from parplan.solver.wire import graph_to_dict

#: Qwen2 (RMSNorm, rotary tables, q/k/v biases, grouped-query attention 8/4, SwiGLU) shrunk to
#: 0.48 M parameters.
QWEN2_TINY: dict[str, Any] = {
    "model_type": "qwen2", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
    "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 512, "max_position_embeddings": 64,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "use_sliding_window": False,
}
#: Qwen2-MoE (4 routed experts, top 2, a gated shared expert, tied embeddings), as
#: ``tests/data/hf/qwen2_moe.json`` but twice as wide.
QWEN2_MOE_TINY: dict[str, Any] = {
    "model_type": "qwen2_moe", "hidden_size": 128, "intermediate_size": 256, "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 128, "num_experts": 4, "num_experts_per_tok": 2, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 64,
    "tie_word_embeddings": True,
}


def traced_graph(cfg: Mapping[str, Any], name: str, batch: int, seq_len: int) -> Graph:
    """The traced graph of ``cfg`` for one micro-step of ``batch`` samples of ``seq_len`` tokens."""
    from parplan.solver.frontends.hf_trace import trace_hf_config

    graph = trace_hf_config(cfg, name, seq_len=seq_len, batch=batch)
    check_graph(graph)
    return graph


def traced_ilp_plan(graph: Graph, mesh: tuple[int, ...], objective: str = "min-memory") -> dict[str, Any]:
    """The ILP's own plan for one micro-step of ``graph`` (at its batch) on ``mesh``, priced as the
    agent runs it (fp32, fused attention, ZeRO 0 or 3; as :func:`~parplan.agent.ilp_validate.ilp_plan`)."""
    from parplan.solver.calibration import DEFAULT_CALIBRATION
    from parplan.solver.cluster import make_cluster
    from parplan.solver.cost.runtime import Runtime
    from parplan.solver.frontends.resize import resize_graph
    from parplan.solver.ilp.search import search

    world = math.prod(mesh)
    batch = int(traced_spec(graph, {}, mesh, "").batch)
    cluster = make_cluster(world, world, "A100-80GB")
    return search(lambda b: resize_graph(graph, {"batch": b}), cluster, global_batch=batch, micro_batch=batch,
                  objective=objective, budget_bytes=cluster.device_memory_bytes, max_slowdown=DEFAULT_MAX_SLOWDOWN,
                  alpha_gib_per_s=None, calibration=DEFAULT_CALIBRATION, precision="fp32", flash_attention=True,
                  timeout_seconds=120, fixed_mesh=mesh, zero_stages=(0, 3), runtime=Runtime.INTERPRETER_CPU,
                  zero3_per_operator=True).to_document()


def tensor_parallel_strategies(graph: Graph, mesh: Mesh) -> dict[str, dict[str, Any]]:
    """Megatron-style tensor parallelism over the mesh's last axis, for every operator: attention
    heads (query heads within key heads follow the key heads), the MLP's hidden units and the
    vocabulary split; norms, residual adds and the loss's reduction replicated (no sequence
    parallelism, no ZeRO)."""
    axis = mesh.names[-1]
    return {n.id: {"assignment": list(uniform_assignment(n, graph, mesh, None, axis, False)), "zero": 0}
            for n in graph.nodes if not n.is_leaf}


def expert_parallel_strategies(graph: Graph, mesh: Mesh) -> dict[str, dict[str, Any]]:
    """Expert parallelism with data parallelism on the same axes: dispatch, combine and the
    experts' operators (``[expert, capacity, ...]``) split by ``expert``, every other operator by
    the batch (the router too), operators with neither replicated (no ZeRO)."""
    out: dict[str, dict[str, Any]] = {}
    for n in graph.nodes:
        if n.is_leaf:
            continue
        dims, _ = loop_dims(n, graph)
        batch = next((x for x in dims if x in BATCH_DIMS), None)
        if n.kind in (OpKind.DISPATCH, OpKind.COMBINE) or (batch is None and "expert" in dims):
            d: str | None = "expert"
        else:
            d = batch
        out[n.id] = {"assignment": [d] * len(mesh.axes), "zero": 0}
    return out


def traced_spec(graph: Graph, strategies: dict[str, dict[str, Any]], mesh: tuple[int, ...], label: str,
                diagnose: bool = False) -> IlpRunSpec:
    """The run of ``strategies`` on ``graph`` (batch and sequence: the sizes of its dims of those names)."""
    sizes = {d: s for n in graph.nodes if not n.is_parameter for d, s in n.dims}
    return IlpRunSpec(model={}, batch=int(sizes.get("batch", 0)), seq_len=int(sizes.get("seq", 0)),
                      mesh=list(mesh), strategies=strategies, label=label, diagnose=diagnose,
                      graph_doc=graph_to_dict(graph))


def run_traced(graph: Graph, strategies: dict[str, dict[str, Any]], mesh: tuple[int, ...], label: str,
               summary: str, device_kind: str = "cpu", diagnose: bool = False) -> dict[str, Any]:
    """Run the strategies (:func:`as_executed`) on ``prod(mesh)`` local processes: correctness against
    one process and measured vs predicted memory per rank
    (:func:`~parplan.agent.ilp_validate.run_and_compare_spec`), and ``notes``."""
    executed, notes = as_executed(graph, strategies)
    spec = traced_spec(graph, executed, mesh, label, diagnose)
    predicted = predicted_graph_memory(graph, spec)
    return {**run_and_compare_spec(spec, predicted, summary, device_kind), "notes": notes}

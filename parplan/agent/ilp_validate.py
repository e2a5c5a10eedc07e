"""Validate an ILP plan: search it for a small model, run it with DTensor, compare.

The plan is the ILP's own (:func:`parplan.solver.ilp.search.search` on a fixed mesh, fp32,
fused attention, ZeRO 0 or 3, one micro-step), executed operator by operator by
:mod:`parplan.agent.ilp_exec`. The prediction is the plan's per-device memory (the ILP's
certificate) under the interpreter's rules (``Runtime.INTERPRETER_CPU``: PyTorch's on CPU kernels,
DTensor keeps the copy of an input it converted for an operator, RMSNorm keeps its input and
``rstd``); the measurement is each rank's MemTracker peak by category.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from parplan.agent.ilp_exec import IlpRunSpec, run_ilp_specs, strategies_from_plan
from parplan.agent.launch import launch_function
from parplan.agent.plan_interpreter import check_graph
from parplan.agent.plans import AUTO_SHRINK_PARAMETERS, model_of_request
from parplan.solver.calibration import DEFAULT_CALIBRATION
from parplan.solver.cluster import make_cluster
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.precision import get_precision
from parplan.solver.cost.runtime import Runtime
from parplan.solver.errors import StrategyError
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.ilp.moments import walk_peak
from parplan.solver.ilp.problem import build_problem
from parplan.solver.ilp.search import certify, mesh_links, search
from parplan.solver.ilp.strategies import Mesh, OpStrategy
from parplan.solver.ir import Graph, OpKind
from parplan.solver.models import ModelSource
from parplan.solver.objective import DEFAULT_MAX_SLOWDOWN

CATEGORIES = ("parameters", "gradients", "optimizer_states", "activations", "temporary")


def ilp_plan(cfg: TransformerConfig, mesh: tuple[int, ...], batch: int, seq_len: int,
             objective: str = "min-memory") -> dict[str, Any]:
    """The ILP's plan for one micro-step of ``batch`` samples on ``mesh`` (fp32, fused attention)."""
    world = math.prod(mesh)
    cluster = make_cluster(world, world, "A100-80GB")
    check_graph(build_graph(cfg, batch=batch, seq_len=seq_len))
    return search(lambda b: build_graph(cfg, batch=b, seq_len=seq_len), cluster, global_batch=batch,
                  micro_batch=batch, objective=objective, budget_bytes=cluster.device_memory_bytes,
                  max_slowdown=DEFAULT_MAX_SLOWDOWN, alpha_gib_per_s=None, calibration=DEFAULT_CALIBRATION,
                  precision="fp32", flash_attention=True, timeout_seconds=120, fixed_mesh=mesh, zero_stages=(0, 3),
                  runtime=Runtime.INTERPRETER_CPU, zero3_per_operator=True).to_document()


def predicted_memory(cfg: TransformerConfig, batch: int, seq_len: int, spec: IlpRunSpec,
                     recompute: str = "selective") -> dict[str, Any]:
    """The ILP cost model's per-device memory of the strategies ``spec`` runs, priced for what runs:
    fp32, fused attention (the plan's certificate, recomputed for this precision)."""
    return predicted_graph_memory(build_graph(cfg, batch=batch, seq_len=seq_len), spec, recompute)


def predicted_graph_memory(graph: Graph, spec: IlpRunSpec, recompute: str = "selective") -> dict[str, Any]:
    """:func:`predicted_memory` of any graph (a traced one included) under ``spec``'s strategies."""
    if Recompute(recompute) is Recompute.FULL:
        raise StrategyError("the ILP-plan executor does not recompute blocks; plans with full recomputation "
                            "are not executed")
    mesh = Mesh(tuple((f"m{i}", s) for i, s in enumerate(spec.mesh)))
    cluster = make_cluster(mesh.num_devices, mesh.num_devices, "A100-80GB")
    gp = build_problem(graph, mesh, mesh_links(cluster, mesh), cluster.gpu, DEFAULT_CALIBRATION, get_precision("fp32"),
                       1, Recompute(recompute), True, prune=False, runtime=Runtime.INTERPRETER_CPU,
                       zero3_per_operator=True)
    choice = {}
    for rep, cands in gp.strategies.items():
        want = OpStrategy(tuple(spec.strategies[rep]["assignment"]), int(spec.strategies[rep]["zero"]))
        if want not in cands:
            raise StrategyError(f"operator {rep}: strategy {want.describe(mesh)} is not a candidate on this mesh")
        choice[rep] = cands.index(want)
    memory = certify(gp, choice).memory
    above, temporary = walk_peak(gp, choice)
    memory = memory.replace(temporary=temporary)
    return {"peak_bytes": round(memory.model_states + above), "breakdown": memory.as_dict()}


def as_executed(graph: Graph, strategies: dict[str, dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The strategies the interpreter runs, and notes on what differs: it computes a loss on whole
    rows of logits (gathering a split class dim; vocabulary-parallel cross entropy is not executed),
    so a loss that splits its classes is run, and predicted, with them whole."""
    out = dict(strategies)
    changed = []
    for n in graph.nodes:
        if n.kind is OpKind.CROSS_ENTROPY and n.id in out:
            cdim = str(n.attrs.get("class_dim", "vocab"))
            st = out[n.id]
            if cdim in st["assignment"]:
                out[n.id] = {**st, "assignment": [None if d == cdim else d for d in st["assignment"]]}
                changed.append(n.id)
    notes = [f"the loss {', '.join(changed)} splits its classes in the plan; run and predicted with the logits "
             f"gathered (the interpreter has no vocabulary-parallel cross entropy)"] if changed else []
    return out, notes


def spec_for_plan(cfg: TransformerConfig, plan: dict[str, Any], batch: int, seq_len: int,
                  label: str = "", diagnose: bool = False) -> IlpRunSpec:
    """The run of ``plan``. The executor runs ZeRO 0 and 3 only: an operator the plan gives ZeRO-1 or
    ZeRO-2 runs (and is predicted) without ZeRO, and the run's notes say so."""
    graph = build_graph(cfg, batch=batch, seq_len=seq_len)
    mesh = [int(s) for s in plan["strategy"]["mesh"]["shape"]]
    strategies = strategies_from_plan(plan, graph)
    downgraded = sorted(op for op, st in strategies.items() if int(st.get("zero", 0)) in (1, 2))
    for op in downgraded:
        strategies[op] = {**strategies[op], "zero": 0}
    notes = [f"ZeRO-1/2 of {len(downgraded)} operators run and predicted as plain data parallelism (this "
             f"executor runs ZeRO 0 and 3)"] if downgraded else []
    strategies, loss_notes = as_executed(graph, strategies)
    notes += loss_notes
    return IlpRunSpec(model=asdict(cfg), batch=batch, seq_len=seq_len, mesh=mesh, strategies=strategies,
                      label=label or cfg.name, diagnose=diagnose, extra={"notes": notes})


def run_and_compare_plan(cfg: TransformerConfig, plan: dict[str, Any], batch: int, seq_len: int,
                         device_kind: str = "cpu", label: str = "", diagnose: bool = False) -> dict[str, Any]:
    """Run ``plan`` on ``prod(mesh)`` local processes; measured vs predicted per rank."""
    spec = spec_for_plan(cfg, plan, batch, seq_len, label, diagnose)
    predicted = predicted_memory(cfg, batch, seq_len, spec, str(plan["strategy"].get("recompute", "selective")))
    return run_and_compare_spec(spec, predicted, plan["strategy"]["summary"], device_kind)


def run_and_compare_spec(spec: IlpRunSpec, predicted: dict[str, Any], summary: str,
                         device_kind: str = "cpu") -> dict[str, Any]:
    """Run ``spec`` on ``prod(mesh)`` local processes; each rank's measurement against ``predicted``
    (one device's memory, :func:`predicted_graph_memory`)."""
    per_rank = launch_function(run_ilp_specs, ([spec.to_dict()],), spec.world, device_kind)
    reports = sorted((r[0] for r in per_rank), key=lambda r: r["rank"])
    predicted = {**predicted, "breakdown": {k: predicted["breakdown"][k] for k in CATEGORIES}}
    ranks = []
    for r in reports:
        meas = r["measured"]
        err = (meas["peak_bytes"] - predicted["peak_bytes"]) / predicted["peak_bytes"]
        ranks.append({"rank": r["rank"], "measured": {"peak_bytes": meas["peak_bytes"],
                                                      "breakdown": {k: meas["breakdown"][k] for k in CATEGORIES},
                                                      **({"contents": meas["contents"]} if "contents" in meas else {})},
                      "predicted": predicted, "relative_error": err, "check": r["check"]})
    loaded = max(ranks, key=lambda x: x["measured"]["peak_bytes"])
    return {"label": spec.label, "mesh": spec.mesh, "plan": summary, "ranks": ranks,
            "correct": all(x["check"]["ok"] for x in ranks),
            "most_loaded": {"rank": loaded["rank"], "measured_peak_bytes": loaded["measured"]["peak_bytes"],
                            "predicted_peak_bytes": predicted["peak_bytes"],
                            "relative_error": loaded["relative_error"]}}


def measurement_for_validation(validation: dict[str, Any], device_kind: str, max_procs: int,
                               hardware_key: str, diagnose: bool = False) -> dict[str, Any]:
    """The ``measurement`` of a claimed validation whose plan is an ILP plan.

    ILP plans run as planned, not shrunk (their strategies are per operator and per shape): the
    model and the mesh must fit this machine, else StrategyError says so."""
    plan = validation.get("plan") or {}
    request = validation.get("request") or {}
    cfg = model_of_request(request)
    params = ModelSource(cfg.name, config=cfg).parameter_count()
    if params > AUTO_SHRINK_PARAMETERS or validation.get("shrink"):
        raise StrategyError(f"ILP plans are validated as planned, not shrunk; {cfg.name} has {params:,} "
                            f"parameters (at most {AUTO_SHRINK_PARAMETERS:,})")
    strategy = plan.get("strategy") or {}
    mesh = [int(s) for s in (strategy.get("mesh") or {}).get("shape") or []]
    if not mesh or math.prod(mesh) > max_procs:
        raise StrategyError(f"the plan's mesh {mesh} needs more than the {max_procs} processes this agent runs")
    seq = int((plan.get("model") or {}).get("seq_len") or cfg.seq_len)
    result = run_and_compare_plan(cfg, plan, int(strategy["micro_step_batch"]), seq, device_kind,
                                  label=f"validation {validation.get('id', '')}", diagnose=diagnose)
    ranks = []
    for r in result["ranks"]:
        pred = r["predicted"]
        rel = {k: (r["measured"]["breakdown"][k] - pred["breakdown"][k]) / pred["breakdown"][k]
               if pred["breakdown"][k] else None for k in CATEGORIES}
        ranks.append({"rank": r["rank"], "stage": 0, "coords": {}, "measured": r["measured"], "predicted": pred,
                      "relative_error": {"peak_bytes": r["relative_error"], **rel}, "check": r["check"]})
    return {"hardware_key": hardware_key, "ranks": ranks,
            "max_relative_error": max(abs(r["relative_error"]["peak_bytes"]) for r in ranks),
            "most_loaded": result["most_loaded"], "correct": result["correct"],
            "config": {"model": asdict(cfg), "kind": "intra-operator", "mesh": mesh, "plan": result["plan"],
                       "micro_step_batch": int(strategy["micro_step_batch"]), "seq_len": seq, "precision": "fp32",
                       "executor": "DTensor per operator (parplan.agent.ilp_exec)"}}

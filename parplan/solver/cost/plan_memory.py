"""Per-stage memory of a uniform strategy, and its most loaded device.

Each pipeline stage's devices hold: the model states of the parameters its nodes use (a tied
embedding used on the first and last stage is resident on both), the saved activations of one
micro-batch times the stage's in-flight count, and a temporary peak: the largest of

- the activations of one block while it is recomputed in backward (full recomputation),
- ZeRO-3's gathered parameters of one block, twice (the current and the prefetched one), plus
  that block's unsharded gradient before its reduce-scatter,
- the gradient of the logits (the last stage),
- a sequence-parallel all-gather of one block's input.

Units (blocks) are priced once per distinct structure by :class:`~parplan.solver.cost.units.GraphCosts`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from parplan.solver.cost.memory import Memory, MemoryBreakdown
from parplan.solver.cost.pipeline import in_flight_microbatches, stage_of_units
from parplan.solver.cost.precision import Precision, get_precision
from parplan.solver.cost.units import GraphCosts, ParamGroup, UnitStrategy
from parplan.solver.ir import Graph
from parplan.solver.strategy import ParallelConfig, check_divisibility


@dataclass(frozen=True)
class StageMemory:
    """One pipeline stage: per-device bytes, activations of one micro-batch, in-flight count."""

    stage: int
    units: tuple[str, ...]
    memory: Memory
    activation_bytes_per_microbatch: float
    in_flight_microbatches: float

    @property
    def peak_bytes(self) -> float:
        return self.memory.bytes.total


@dataclass(frozen=True)
class PlanMemory:
    stages: tuple[StageMemory, ...]

    @property
    def peak_stage(self) -> StageMemory:
        """The most loaded stage (the first when several tie)."""
        return max(self.stages, key=lambda s: (s.peak_bytes, -s.stage))

    @property
    def peak_bytes(self) -> float:
        return self.peak_stage.peak_bytes


def unit_strategy(cfg: ParallelConfig) -> UnitStrategy:
    return UnitStrategy(tp=cfg.tp, sp=cfg.sequence_parallel, ep=cfg.expert_parallel, recompute=cfg.recompute,
                        flash_attention=cfg.flash_attention)


def model_states(groups: Mapping[ParamGroup, float], cfg: ParallelConfig, prec: Precision) -> Memory:
    """Weights, gradients and optimizer states of parameter elements, with ZeRO over the data
    axes: dense parameters shard over all ``dp`` ranks, expert parameters over ``dp / ep``."""
    held = {"parameters": 0.0, "gradients": 0.0, "optimizer_states": 0.0}
    redundant = dict(held)
    per_elem = {"parameters": (prec.param_bytes, cfg.zero >= 3), "gradients": (prec.grad_bytes, cfg.zero >= 2),
                "optimizer_states": (prec.optimizer_state_bytes, cfg.zero >= 1)}
    for group, elems in groups.items():
        nz = cfg.dp // cfg.expert_parallel if group.expert else cfg.dp
        rep = cfg.tp if group.tp_replicated else 1
        for cat, (nbytes, sharded) in per_elem.items():
            h = elems * nbytes / (nz if sharded else 1)
            r = rep * (1 if sharded else nz)
            held[cat] += h
            redundant[cat] += h * (1 - 1 / r)
    return Memory(MemoryBreakdown(**held), MemoryBreakdown(**redundant))


def _merge(a: dict[ParamGroup, float], b: Mapping[ParamGroup, float]) -> None:
    for g, e in b.items():
        a[g] = a.get(g, 0.0) + e


def stage_units(costs: GraphCosts, cfg: ParallelConfig) -> tuple[dict[str, int], list[list[str]]]:
    unit_stage = stage_of_units(costs.graph, cfg.pp, cfg.partition)
    by_stage: list[list[str]] = [[] for _ in range(cfg.pp)]
    for u in costs.units:
        by_stage[unit_stage.get(u, 0)].append(u)
    return unit_stage, by_stage


def plan_memory(graph: Graph, cfg: ParallelConfig, costs: GraphCosts | None = None) -> PlanMemory:
    """Memory of every stage of ``graph`` (built for one micro-batch) under ``cfg``."""
    check_divisibility(graph, cfg)
    gc = costs or GraphCosts(graph)
    prec = get_precision(cfg.precision)
    s = unit_strategy(cfg)
    _, by_stage = stage_units(gc, cfg)
    stages = []
    for stage, units in enumerate(by_stage):
        groups: dict[ParamGroup, float] = {}
        act = act_red = 0.0
        temp = 0.0
        for u in units:
            c = gc.unit_cost(u, s, prec)
            _merge(groups, c.params)
            act += c.act_bytes
            act_red += c.act_redundant_bytes
            temp = max(temp, c.recompute_peak_bytes, c.logits_grad_bytes, c.sp_gather_bytes)
            if cfg.zero >= 3 and gc.nodes[u] and u != "" and u.rpartition(".")[2].isdigit():
                temp = max(temp, c.param_elems_all * (2 * prec.param_bytes + prec.grad_bytes))
        _merge(groups, gc.shared_param_elems(units, s))
        shared_act, shared_red = gc.shared_item_bytes(units, s, prec.activation_bytes)
        act += shared_act
        act_red += shared_red
        flight = in_flight_microbatches(stage, cfg.pp, cfg.num_microbatches, cfg.schedule, cfg.virtual_stages)
        states = model_states(groups, cfg, prec)
        held = states.bytes.replace(activations=act * flight, temporary=temp)
        red = states.redundant.replace(activations=act_red * flight)
        stages.append(StageMemory(stage, tuple(units), Memory(held, red), act, flight))
    return PlanMemory(tuple(stages))

"""A plan whose blocks may each use a different strategy (Galvatron-BMW's per-layer decision tree).

A :class:`LayerPlan` cuts the blocks into pipeline stages and gives every block a
:class:`LayerStrategy` — its tensor- and data-parallel degrees inside the stage, their nesting
order, the ZeRO stage of its data parallelism, sequence parallelism, recomputation and expert
parallelism. Units that are not blocks (embedding, LM head, a T5 encoder's final norm) take the
strategy of the block beside them. A uniform (Megatron-style) strategy is the special case where
every block agrees (:func:`~parplan.solver.cost.plan_memory.layer_plan`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.runtime import Runtime
from parplan.solver.cost.unit_strategy import UnitStrategy
from parplan.solver.cost.units import GraphCosts
from parplan.solver.errors import StrategyError
from parplan.solver.strategy import Schedule, hybrid_groups

#: the model's graph costs for one data-parallel rank's batch per micro-batch
CostsFor = Callable[[int], GraphCosts]


@dataclass(frozen=True)
class LayerStrategy:
    """One block's strategy inside its pipeline stage (``tp * cp * dp`` = the stage's devices)."""

    tp: int = 1
    dp: int = 1
    zero: int = 0  # 0: plain data parallelism; 1, 2: ZeRO; 3: sharded data parallelism (FSDP)
    sp: bool = False
    recompute: Recompute = Recompute.SELECTIVE
    tp_inner: bool = True  # TP ranks are consecutive devices (else the DP ranks are)
    ep: int = 1  # expert-parallel degree (MoE), dividing dp
    cp: int = 1  # context-parallel degree: the sequence split over cp ranks, the same for every block
    cp_comm: str = "p2p"  # how attention exchanges under CP: the ring (p2p) or all-to-alls (a2a, Ulysses)
    #: hybrid sharding: ZeRO within groups of dp_shard ranks, replicated across dp / dp_shard (0: all of dp)
    dp_shard: int = 0
    #: the experts' own tensor-parallel degree (Megatron-LM's --expert-tensor-parallel-size); 0: tp
    etp: int = 0

    def __post_init__(self) -> None:
        if self.etp == self.tp:
            object.__setattr__(self, "etp", 0)  # one spelling of the experts on tp

    def unit(self, flash_attention: bool, runtime: Runtime = Runtime.MEGATRON) -> UnitStrategy:
        return UnitStrategy(tp=self.tp, sp=self.sp, ep=self.ep, recompute=self.recompute,
                            flash_attention=flash_attention, runtime=runtime, cp=self.cp, cp_comm=self.cp_comm,
                            etp=self.etp)

    @property
    def expert_tp(self) -> int:
        """The experts' tensor-parallel degree."""
        return self.etp or self.tp

    @property
    def data_ranks(self) -> int:
        """Ranks that hold the same weights and reduce their gradients together: ``dp x cp``."""
        return self.dp * self.cp

    @property
    def layout_key(self) -> tuple[int, ...]:
        """What decides the layout of the activation between blocks."""
        key = (self.tp, self.dp, self.tp_inner, self.sp, self.ep)
        return (*key, self.cp) if self.cp > 1 else key  # (etp: inside a block only)

    def describe(self) -> str:
        cp = f"cp{self.cp}" + (" a2a" if self.cp_comm == "a2a" else "")
        parts = [f"tp{self.tp}", f"dp{self.dp}"] + ([cp] if self.cp > 1 else [])
        if self.zero:
            parts.append("sdp" if self.zero == 3 else f"zero{self.zero}")
        if self.dp_shard:
            parts.append(f"hsdp{replicate_ranks(self)}x{self.dp_shard}")
        if self.sp:
            parts.append("sp")
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        if self.etp:
            parts.append(f"etp{self.etp}")
        if self.tp > 1 and self.dp > 1:
            parts.append("tp-inner" if self.tp_inner else "dp-inner")
        parts.append("ckpt" if self.recompute is Recompute.FULL else self.recompute.value)
        return " ".join(parts)


@dataclass(frozen=True)
class LayerPlan:
    """Pipeline degree, micro-batching, and a strategy per block."""

    pp: int
    num_microbatches: int
    global_batch: int
    layers: Mapping[str, LayerStrategy]
    partition: tuple[int, ...] | None = None
    schedule: Schedule = Schedule.ONE_F_ONE_B
    virtual_stages: int = 1
    flash_attention: bool = True
    precision: str = "bf16"
    runtime: Runtime = Runtime.MEGATRON  # whose buffers the memory counts (see cost.runtime)
    sync_every_microbatch: bool = False  # gradients reduced after every micro-batch, not only the last
    tp_comm_overlap: bool = False  # Megatron-LM's --tp-comm-overlap: TP collectives under the unit's GEMMs
    overlap_param_gather: bool = False  # Megatron-LM's --overlap-param-gather: weight all-gather under forward
    overlap_grad_reduce: bool = True  # gradients reduced under the backward (false: Megatron-LM without the flag)
    pp_scatter_gather: bool = False  # Megatron-LM's scatter-gather-tensors-in-pipeline: hand-offs split over TP
    optimizer_offload: float = 0.0  # the fraction of the optimizer's states and master weights on the host (.offload)
    _devices: int = field(default=0, compare=False)

    def local_batch(self, s: LayerStrategy) -> int:
        """Samples one data-parallel rank of a block processes per micro-batch."""
        per = self.num_microbatches * s.dp
        if self.global_batch % per:
            raise StrategyError(f"global batch {self.global_batch} is not a multiple of {self.num_microbatches} "
                                f"micro-batches x dp {s.dp}")
        return self.global_batch // per

    @property
    def first_strategy(self) -> LayerStrategy:
        """The first block's strategy (its local batch sizes the graph the plan's structure is read from)."""
        return next(iter(self.layers.values()))

    @property
    def chunks(self) -> int:
        """Model chunks per device: ``v`` under the interleaved schedules (2 under ``zbv``), else 1."""
        if self.schedule.zero_bubble:
            return self.virtual_stages
        return self.virtual_stages if self.schedule is Schedule.INTERLEAVED and self.virtual_stages > 1 else 1


def plan_key(plan: LayerPlan) -> tuple[Any, ...]:
    """Everything a plan's memory and time depend on, hashable (two plans with equal keys are
    priced the same)."""
    return (plan.pp, plan.num_microbatches, plan.global_batch, plan.partition, plan.schedule, plan.virtual_stages,
            plan.flash_attention, plan.precision, plan.runtime, plan.sync_every_microbatch,
            plan.tp_comm_overlap, plan.overlap_param_gather, plan.overlap_grad_reduce, plan.pp_scatter_gather,
            plan.optimizer_offload, tuple(plan.layers.items()))


def group_ranks(s: LayerStrategy, expert: bool) -> int:
    """Ranks a parameter's gradients are reduced over: ``dp x cp``; an expert's, its expert-data-parallel
    group, ``tp x dp x cp / (etp x ep)`` (Megatron-LM's expert rank generator: the stage's ranks as
    ``etp x ep x expert-dp``; ``dp x cp / ep`` with ``etp = tp``)."""
    return s.data_ranks * s.tp // (s.expert_tp * s.ep) if expert else s.data_ranks


def tensor_ranks(s: LayerStrategy, expert: bool) -> int:
    """Ranks a parameter that tensor parallelism leaves whole is replicated over: the TP group, an
    expert's the expert tensor-parallel group."""
    return s.expert_tp if expert else s.tp


def shard_ranks(s: LayerStrategy, expert: bool) -> int:
    """Ranks ZeRO shards a parameter's states over, the one rule of every memory and traffic
    figure: its whole data-parallel group (:func:`group_ranks`), or under hybrid sharding
    (``dp_shard``) one shard group, ``dp_shard x cp`` ranks (an expert's ``/ ep``), each shard
    replicated across the ``dp / dp_shard`` groups (torchtitan's ``dp_shard`` mesh axis, Megatron-LM's
    intra-instance data-parallel group of ``--num-distributed-optimizer-instances``)."""
    if not s.dp_shard:
        return group_ranks(s, expert)
    ranks = s.dp_shard * s.cp
    return ranks // s.ep if expert else ranks  # (no expert tensor-parallel degree of its own here)


def replicate_ranks(s: LayerStrategy) -> int:
    """Groups holding the same shards under hybrid sharding (1 without: :func:`hybrid_groups`)."""
    return hybrid_groups(s.dp, s.dp_shard)[1]

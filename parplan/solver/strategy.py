"""A uniform hybrid-parallel strategy (Megatron-LM style) and the tensor layouts it implies.

TP splits attention heads, MLP hidden units and the vocabulary (Shoeybi et al. 2019); sequence
parallelism additionally splits the sequence of the tensors TP leaves whole (Korthikanti et al.
2022); PP cuts the blocks into stages; DP replicates the rest, with ZeRO sharding optionally;
expert parallelism (MoE) splits the experts over part of the DP group; context parallelism (CP,
Megatron-LM's ``--context-parallel-size``) splits the sequence of every activation over ``cp`` ranks,
attention exchanging key/value chunks in a ring, and reduces gradients over the ``dp x cp`` ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from parplan.solver.cost import recompute_modules
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.precision import PRECISIONS
from parplan.solver.cost.runtime import Runtime
from parplan.solver.errors import StrategyError
from parplan.solver.ir import Graph, OpKind

#: Dims tensor parallelism splits, in order of preference when a tensor has several.
TP_DIMS = ("heads", "kv_heads", "ffn", "vocab", "classes")
#: Dims a TP degree must divide (the vocabulary and classes are padded to a multiple of it instead).
TP_SPLIT_DIMS = ("heads", "kv_heads", "ffn")
SEQ_DIMS = ("seq", "tgt_seq")
#: Dims context parallelism splits: the sequence, or the tokens an expert receives (MoE capacity).
CP_DIMS = ("seq", "capacity")
#: How attention exchanges keys and values under context parallelism (Megatron-LM's --cp-comm-type).
CP_COMM = ("p2p", "a2a")


def hybrid_groups(dp: int, dp_shard: int) -> tuple[int, int]:
    """(ranks ZeRO shards over, groups that hold the same shards) of ``dp`` data-parallel ranks under
    hybrid sharding over ``dp_shard`` of them (:func:`check_dp_shard`); ``(dp, 1)`` without it (0)."""
    shard = dp_shard or dp
    return shard, dp // shard


def expert_data_span(tp: int, ep: int, etp: int) -> int:
    """Data-parallel replicas (``tp x cp`` ranks each) one expert-parallel group spans. Megatron-LM
    regroups a stage's ``tp x cp x dp`` ranks for the experts as ``etp x ep x expert-dp``, the expert
    tensor-parallel ranks innermost (``parallel_state.initialize_model_parallel``'s expert rank
    generator, order tp-ep-dp): a group of ``etp x ep`` consecutive ranks, ``etp x ep / tp`` replicas
    when it is at least one TP group (``ep`` with ``etp = tp``), inside one TP group (1) otherwise."""
    return max(1, etp * ep // tp)


def check_expert_tensor_parallel(tp: int, dp: int, cp: int, ep: int, etp: int, sp: bool, dp_shard: int,
                                 runtime: Runtime) -> None:
    """StrategyError unless parplan models ``etp`` (Megatron-LM's ``--expert-tensor-parallel-size``)
    beside ``tp``: Megatron-LM's own condition, ``etp x ep`` dividing the stage's ``tp x dp x cp``
    ranks (``initialize_model_parallel``: "world_size ... is not divisible by
    expert_tensor_model_pipeline_parallel size") and sequence parallelism with ``tp > 1`` (its MoE layer
    refuses tensor parallelism without it in training), and parplan's: ``etp`` dividing ``tp`` (each
    rank's expert tokens a share of its TP group's), an expert group of whole TP groups or inside one, over
    data-parallel ranks (:func:`expert_data_span`), Megatron-LM's runtime, no hybrid sharding."""
    problems = []
    if etp < 1:
        problems.append(f"expert tensor-parallel degree must be at least 1, got {etp}")
    elif (tp * dp * cp) % (etp * ep):
        problems.append(f"expert tensor-parallel {etp} x expert parallel {ep} must divide tp x dp x cp = "
                        f"{tp * dp * cp}")
    elif tp % etp:
        problems.append(f"an expert tensor-parallel degree {etp} that does not divide tp {tp} is not modelled")
    elif (etp * ep) % tp and tp % (etp * ep):
        problems.append(f"an expert-parallel group of {etp} x {ep} ranks that neither holds whole TP groups of "
                        f"{tp} nor lies inside one is not modelled")
    elif dp % expert_data_span(tp, ep, etp):
        problems.append(f"expert parallelism across the context-parallel ranks (etp {etp} x ep {ep} spans "
                        f"{expert_data_span(tp, ep, etp)} replicas, dp is {dp}) is not modelled")
    if tp > 1 and not sp:  # megatron/core/transformer/moe/moe_layer.py refuses it in training
        problems.append("experts with tensor parallelism without sequence parallelism: Megatron-LM's MoE layer "
                        "refuses it (\"performance may degrade if MoE and tensor parallelism are enabled without "
                        "also enabling sequence parallelism\")")
    if dp_shard:
        problems.append("an expert tensor-parallel degree other than tp with hybrid sharding is not modelled")
    if runtime is not Runtime.MEGATRON:
        problems.append(f"an expert tensor-parallel degree other than tp is Megatron-LM's; runtime is {runtime}")
    if problems:
        raise StrategyError("; ".join(problems))


def check_dp_shard(dp: int, dp_shard: int, zero: int, ep: int, runtime: Runtime) -> None:
    """StrategyError unless ``dp_shard`` is a hybrid sharding the trainers run: ZeRO shards within
    groups of ``dp_shard`` data-parallel ranks (x ``cp``) and the ``dp / dp_shard`` groups replicate
    (torchtitan's ``data_parallel_shard_degree`` x ``data_parallel_replicate_degree``, Megatron-LM's
    ``--num-distributed-optimizer-instances``). 0 (or ``dp``) is ZeRO over all of ``dp``. The
    expert-parallel ranks lie inside a shard group (``ep`` divides ``dp_shard``: each expert's
    weights shard over ``dp_shard x cp / ep`` ranks and replicate across the groups)."""
    if dp_shard < 0:
        raise StrategyError(f"dp_shard must be 0 (all of dp) or at least 1, got {dp_shard}")
    if dp_shard in (0, dp):
        return
    problems = []
    if dp % dp_shard:
        problems.append(f"dp_shard {dp_shard} must divide dp {dp}")
    if zero < 1:
        problems.append(f"dp_shard {dp_shard} shards ZeRO states within groups: it needs zero >= 1, got zero {zero}")
    if dp_shard % ep:
        problems.append(f"expert parallel degree {ep} must divide dp_shard {dp_shard} (the experts lie inside a "
                        f"shard group)")
    if runtime in (Runtime.DEEPSPEED, Runtime.NANOTRON):
        problems.append(f"runtime {runtime} has no hybrid sharding parplan models (DeepSpeed's ZeRO++ hpZ keeps a "
                        f"secondary weight copy instead; nanotron shards over all of dp)")
    if problems:
        raise StrategyError("; ".join(problems))


class Schedule(StrEnum):
    """Pipeline schedules. The zero-bubble ones (Qi et al., "Zero Bubble Pipeline Parallelism",
    ICLR 2024) split each backward into B (input gradient) and W (weight gradient) and run W in the
    bubbles: ``interleaved-zb`` is PyTorch's ``ScheduleInterleavedZeroBubble`` (ZB-H1 on ``v``
    chunks per device, ZB-H1 itself with one), ``zbv`` its ``ScheduleZBVZeroBubble`` (two chunks per
    device in a V: device ``i`` holds virtual stages ``i`` and ``2p − 1 − i``), ``dualpipev`` its
    ``ScheduleDualPipeV`` (DeepSeek-V3's DualPipe, arXiv 2412.19437, on the same V: a forward of one
    chunk overlapped with a backward of the other)."""

    ONE_F_ONE_B = "1f1b"
    GPIPE = "gpipe"
    INTERLEAVED = "interleaved"
    INTERLEAVED_ZB = "interleaved-zb"
    ZBV = "zbv"
    DUALPIPEV = "dualpipev"

    @property
    def zero_bubble(self) -> bool:
        """The backward runs as B then W (torch.distributed.pipelining's I and W actions)."""
        return self in (Schedule.INTERLEAVED_ZB, Schedule.ZBV, Schedule.DUALPIPEV)

    @property
    def v_shape(self) -> bool:
        """Two chunks per device in a V (PyTorch's ``generate_stage_to_rank_mapping(style="v")``)."""
        return self in (Schedule.ZBV, Schedule.DUALPIPEV)

    @property
    def chunked(self) -> bool:
        """Devices may hold several model chunks (``virtual_stages``)."""
        return self in (Schedule.INTERLEAVED, Schedule.INTERLEAVED_ZB, Schedule.ZBV, Schedule.DUALPIPEV)


#: Runtimes whose pipelining is ``torch.distributed.pipelining`` (what runs the zero-bubble schedules).
PIPELINING_RUNTIMES = (Runtime.TORCH, Runtime.TORCH_CPU, *(r for r in Runtime if r.torchtitan))


def check_schedule(schedule: Schedule, runtime: Runtime, pp: int, m: int, virtual_stages: int) -> None:
    """StrategyError unless the runtime runs ``schedule`` as given. The micro-batch rules are the
    asserts of torch/distributed/pipelining/schedules.py: ``ScheduleInterleavedZeroBubble`` needs
    ``m`` a multiple of its rounds ``max(1, m // pp)``; ``ScheduleZBVZeroBubble`` exactly two stages
    per rank (``ScheduleDualPipeV`` too, and at least as many micro-batches as stages)."""
    if schedule is Schedule.INTERLEAVED:
        if pp == 1:
            raise StrategyError("the interleaved schedule needs pp > 1")
        if m % pp:
            raise StrategyError(f"the interleaved schedule needs the micro-batch count "
                                f"({m}) to be a multiple of pp ({pp})")
    if not schedule.zero_bubble:
        return
    if runtime not in PIPELINING_RUNTIMES:
        raise StrategyError(f"the {schedule} schedule is torch.distributed.pipelining's; runtime {runtime} "
                            f"does not run it (runtimes: {', '.join(PIPELINING_RUNTIMES)})")
    if pp == 1:
        raise StrategyError(f"the {schedule} schedule needs pp > 1")
    if schedule.v_shape and virtual_stages != 2:
        raise StrategyError(f"the {schedule} schedule runs exactly 2 chunks per device, got virtual_stages "
                            f"{virtual_stages}")
    if schedule is Schedule.DUALPIPEV and m < 2 * pp:
        raise StrategyError(f"the dualpipev schedule needs at least 2pp = {2 * pp} micro-batches, got {m} "
                            "(ScheduleDualPipeV)")
    rounds = max(1, m // pp)
    if schedule is Schedule.INTERLEAVED_ZB and m % rounds:
        raise StrategyError(f"the interleaved-zb schedule needs the micro-batch count ({m}) to be a multiple of "
                            f"its rounds max(1, m // pp) = {rounds} (ScheduleInterleavedZeroBubble)")


def check_precision_runtime(precision: str, runtime: Runtime) -> None:
    """StrategyError where a precision is one trainer's and the runtime another's: torchao's Float8
    (``fp8-torchao*``) is priced as torchtitan runs it, with the torchtitan runtimes only; Megatron-LM's
    ``--fp8-param-gather`` (``fp8*-pg*``) with runtime megatron only; Transformer Engine FusedAdam's
    states (``*-remainders``, ``*-moments-bf16``) with the GPU runtimes whose optimizer it can be (megatron,
    torch: torchtitan's fp32 weights are the master, nanotron and DeepSpeed run their own optimizers)."""
    prec = PRECISIONS.get(precision.lower())
    if prec is not None and prec.torchao and not runtime.torchtitan:
        raise StrategyError(f"precision {prec.name} is torchao's Float8 as torchtitan runs it: runtime torchtitan "
                            f"prices it, not {runtime} (fp8 and fp8-cs are Transformer Engine's)")
    if prec is not None and prec.fp8_weight_gather and not prec.torchao and runtime is not Runtime.MEGATRON:
        raise StrategyError(f"precision {prec.name} is Megatron-LM's --fp8-param-gather: runtime megatron prices "
                            f"it, not {runtime}")
    if prec is not None and prec.te_adam and runtime not in (Runtime.MEGATRON, Runtime.TORCH):
        raise StrategyError(f"precision {prec.name} is Transformer Engine FusedAdam's low-precision states: runtimes "
                            f"megatron (--use-precision-aware-optimizer) and torch (FSDP2 with TE's FusedAdam, as "
                            f"NeMo Automodel runs it) price it, not {runtime}")


def check_te_adam(precision: str, runtime: Runtime, optimizer_offload: float) -> None:
    """StrategyError where Transformer Engine FusedAdam's low-precision states meet Megatron-LM's optimizer
    offload: its ``HybridDeviceOptimizer`` keeps the fp32 master itself (``param_update_in_fp32``,
    ``megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py``) and passes no state dtypes."""
    prec = PRECISIONS.get(precision.lower())
    if prec is not None and prec.te_adam and optimizer_offload and runtime is Runtime.MEGATRON:
        raise StrategyError(f"precision {prec.name} with optimizer_offload: Megatron-LM's hybrid CPU/GPU optimizer "
                            f"keeps fp32 master weights and fp32 moments (give precision {prec.adam_base})")


def check_recompute(runtime: Runtime, recompute: Recompute, precision: str = "bf16") -> None:
    """StrategyError unless ``runtime`` can run ``recompute`` at ``precision`` (per-operator
    checkpointing is PyTorch's; a module set Megatron-LM's, :func:`~.cost.recompute_modules.refusal`)."""
    if recompute.per_module:
        prec = PRECISIONS.get(precision.lower())
        delayed = prec is not None and prec.te_fp8 and not prec.fp8_current_scaling
        why = recompute_modules.refusal(recompute.modules, runtime.runs_recompute_modules, delayed)
        if why is not None:
            raise StrategyError(why)
    if recompute is Recompute.OP and not runtime.per_operator_checkpointing:
        able = ", ".join(r for r in Runtime if r.per_operator_checkpointing)
        raise StrategyError(f"recompute op (per-operator selective checkpointing, PyTorch's "
                            f"create_selective_checkpoint_contexts) needs a PyTorch-native runtime "
                            f"({able}); runtime is {runtime}")


def check_overlaps(runtime: Runtime, tp_comm_overlap: bool, overlap_param_gather: bool, sp: bool,
                   zero: int, overlap_grad_reduce: bool = True, pp_scatter_gather: bool = False) -> None:
    """StrategyError unless Megatron-LM would accept the overlap options: all are its own (runtime
    ``megatron``; every other runtime reduces gradients under the backward; ``pp_scatter_gather``, its
    pipeline hand-offs of 2021-22, too); ``--tp-comm-overlap``
    needs sequence parallelism (Transformer Engine overlaps the all-gathers and reduce-scatters it
    brings), ``--overlap-param-gather`` the distributed optimizer (ZeRO-1 or 2: there is an
    all-gather of updated weights to overlap) and ``--overlap-grad-reduce``."""
    if (tp_comm_overlap or overlap_param_gather) and runtime is not Runtime.MEGATRON:
        raise StrategyError(f"tp_comm_overlap and overlap_param_gather are Megatron-LM options; runtime is {runtime}")
    if pp_scatter_gather and runtime is not Runtime.MEGATRON:
        raise StrategyError(f"pp_scatter_gather is a Megatron-LM setting; runtime is {runtime}")
    if not overlap_grad_reduce and runtime is not Runtime.MEGATRON:
        raise StrategyError(f"overlap_grad_reduce false is a Megatron-LM setting (no --overlap-grad-reduce); "
                            f"runtime {runtime} reduces gradients under the backward")
    if tp_comm_overlap and not sp:
        raise StrategyError("tp_comm_overlap needs sequence parallelism (as Megatron-LM's --tp-comm-overlap)")
    if overlap_param_gather and zero not in (1, 2):
        raise StrategyError("overlap_param_gather needs the distributed optimizer (zero 1 or 2)")
    if overlap_param_gather and not overlap_grad_reduce:
        raise StrategyError("overlap_param_gather needs overlap_grad_reduce (as Megatron-LM's --overlap-param-gather)")


def check_optimizer_offload(runtime: Runtime, fraction: float, zero: int) -> None:
    """StrategyError unless the runtime offloads this fraction of the optimizer (:mod:`.cost.offload`):
    Megatron-LM's hybrid optimizer any fraction, under the distributed optimizer (ZeRO-1; its
    ``--optimizer-cpu-offload`` needs ``--use-precision-aware-optimizer``, which needs
    ``--use-distributed-optimizer``: ``megatron/training/arguments.py``, ``megatron/core/optimizer/__init__.py``);
    DeepSpeed's ZeRO-Offload all of it, under ZeRO 1-3; no other runtime (torchtitan's FSDP2
    ``CPUOffloadPolicy`` moves weights and gradients with the states, which is not modelled)."""
    if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 <= fraction <= 1:
        raise StrategyError(f"optimizer_offload must be a fraction in [0, 1], got {fraction!r}")
    if not fraction:
        return
    if runtime is Runtime.MEGATRON:
        if zero != 1:
            raise StrategyError("optimizer_offload under Megatron-LM needs the distributed optimizer (zero 1): "
                                "--optimizer-cpu-offload needs --use-precision-aware-optimizer, which needs "
                                "--use-distributed-optimizer")
    elif runtime is Runtime.DEEPSPEED:
        if fraction != 1 or zero < 1:
            raise StrategyError(f"optimizer_offload under DeepSpeed is ZeRO-Offload (offload_optimizer): the whole "
                                f"optimizer (1), under ZeRO 1-3; got {fraction} at zero {zero}")
    else:
        raise StrategyError(f"optimizer_offload is modelled for the megatron and deepspeed runtimes only; runtime is "
                            f"{runtime} (torchtitan's FSDP2 CPUOffloadPolicy offloads weights and gradients too: "
                            f"not modelled)")


@dataclass(frozen=True)
class ParallelConfig:
    """Degrees and settings of a uniform strategy; ``tp * cp * pp * dp`` devices.

    ``num_microbatches`` micro-batches of ``micro_batch`` samples per data-parallel replica make
    one step; ``partition`` (blocks per stage) defaults to an even split.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    zero: int = 0
    sequence_parallel: bool = False
    recompute: Recompute = Recompute.SELECTIVE
    micro_batch: int = 1
    num_microbatches: int = 1
    schedule: Schedule = Schedule.ONE_F_ONE_B
    virtual_stages: int = 1
    flash_attention: bool = True
    precision: str = "bf16"
    expert_parallel: int = 1
    #: context-parallel degree: the sequence of every activation split over ``cp`` ranks
    cp: int = 1
    #: how attention exchanges under CP (Megatron-LM's --cp-comm-type): the p2p ring or all-to-alls (a2a)
    cp_comm: str = "p2p"
    partition: tuple[int, ...] | None = field(default=None)
    runtime: Runtime = Runtime.MEGATRON  # the framework whose buffers memory counts (cost.runtime)
    #: reduce gradients after every micro-batch (else, with PyTorch's FSDP2, only after the last: see
    #: Runtime.accumulates_unsharded); more traffic, no unsharded gradients held between micro-batches
    sync_every_microbatch: bool = False
    #: Megatron-LM's ``--tp-comm-overlap`` (Transformer Engine): tensor-parallel all-gathers and
    #: reduce-scatters run under the GEMMs beside them, exposed only beyond those GEMMs' time
    tp_comm_overlap: bool = False
    #: Megatron-LM's ``--overlap-param-gather`` (distributed optimizer): the updated weights'
    #: all-gather runs under the next step's forward, exposed only beyond that forward's time
    overlap_param_gather: bool = False
    #: gradients reduced under the backward, bucket by bucket (Megatron-LM's ``--overlap-grad-reduce``,
    #: and what every other runtime does); false: Megatron-LM without the flag, after the backward
    overlap_grad_reduce: bool = True
    #: Megatron-LM's pipeline hand-offs of February 2021 to January 2023 (its default then; the
    #: option left with the move into Megatron-Core): without sequence parallelism each TP rank
    #: sends its 1/tp share of the activation to the next stage, which all-gathers it over TP
    pp_scatter_gather: bool = False
    #: the fraction of each rank's optimizer states and fp32 master weights kept and stepped on the
    #: host (Megatron-LM's --optimizer-offload-fraction; DeepSpeed's offload_optimizer: 1)
    optimizer_offload: float = 0.0
    #: hybrid sharded data parallelism: ZeRO shards within groups of ``dp_shard`` data-parallel
    #: ranks, replicated across the ``dp / dp_shard`` groups (:func:`check_dp_shard`); 0: all of dp
    dp_shard: int = 0
    #: the experts' own tensor-parallel degree (Megatron-LM's ``--expert-tensor-parallel-size``): each
    #: expert's weights split over ``etp`` ranks, the experts over ``ep``, the rest of the stage's
    #: ``tp x dp x cp`` ranks their data-parallel group (:func:`check_expert_tensor_parallel`); None: tp
    expert_tensor_parallel: int | None = None

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "micro_batch", "num_microbatches", "virtual_stages", "expert_parallel",
                     "cp"):
            if getattr(self, name) < 1:
                raise StrategyError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.zero not in (0, 1, 2, 3):
            raise StrategyError(f"zero stage must be 0, 1, 2 or 3, got {self.zero}")
        if self.sequence_parallel and self.tp == 1:
            raise StrategyError("sequence parallelism needs tp > 1")
        if self.cp_comm not in CP_COMM:
            raise StrategyError(f"cp_comm must be one of {', '.join(CP_COMM)}, got {self.cp_comm!r}")
        if self.expert_tensor_parallel == self.tp:
            object.__setattr__(self, "expert_tensor_parallel", None)  # one spelling of the experts on tp
        if self.expert_tensor_parallel is not None:
            check_expert_tensor_parallel(self.tp, self.dp, self.cp, self.expert_parallel, self.expert_tensor_parallel,
                                         self.sequence_parallel, self.dp_shard, self.runtime)
        elif self.dp % self.expert_parallel:
            raise StrategyError(f"expert parallel degree {self.expert_parallel} must divide dp {self.dp}")
        check_precision_runtime(self.precision, self.runtime)
        check_dp_shard(self.dp, self.dp_shard, self.zero, self.expert_parallel, self.runtime)
        if self.dp_shard == self.dp:
            object.__setattr__(self, "dp_shard", 0)  # one spelling of sharding over all of dp
        check_recompute(self.runtime, self.recompute, self.precision)
        check_overlaps(self.runtime, self.tp_comm_overlap, self.overlap_param_gather,
                       self.sequence_parallel or self.tp == 1, self.zero if self.dp * self.cp > 1 else 1,
                       self.overlap_grad_reduce, self.pp_scatter_gather)
        check_optimizer_offload(self.runtime, self.optimizer_offload, self.zero)
        check_te_adam(self.precision, self.runtime, self.optimizer_offload)
        check_schedule(self.schedule, self.runtime, self.pp, self.num_microbatches, self.virtual_stages)

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def shard(self) -> int:
        """Data-parallel ranks ZeRO shards over (:func:`hybrid_groups`)."""
        return hybrid_groups(self.dp, self.dp_shard)[0]

    @property
    def replicate(self) -> int:
        """Groups that hold the same shards (:func:`hybrid_groups`)."""
        return hybrid_groups(self.dp, self.dp_shard)[1]

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.num_microbatches * self.dp

    @property
    def expert_tp(self) -> int:
        """The experts' tensor-parallel degree (``tp`` unless ``expert_tensor_parallel`` says otherwise)."""
        return self.expert_tensor_parallel or self.tp

    def mesh(self) -> dict[str, int]:
        """Mesh axes, outermost first: pipeline, data (split into expert-data x expert), context
        (only when ``cp > 1``), tensor; under hybrid sharding the replicate axis ``rep`` comes first
        of the data axes (the shard groups are consecutive ranks). With an expert tensor-parallel degree
        other than tp, ``ep`` is the expert group's span over the data axis (:func:`expert_data_span`)."""
        ep = expert_data_span(self.tp, self.expert_parallel, self.expert_tp)
        cp = {"cp": self.cp} if self.cp > 1 else {}
        rep = {"rep": self.replicate} if self.dp_shard else {}
        return {"pp": self.pp, **rep, "edp": self.shard // ep, "ep": ep, **cp, "tp": self.tp}

    @property
    def data_axes(self) -> tuple[str, ...]:
        return ("rep", "edp", "ep") if self.dp_shard else ("edp", "ep")

    def describe(self) -> str:
        parts = [f"tp{self.tp}", f"pp{self.pp}", f"dp{self.dp}"]
        if self.cp > 1:
            parts.append(f"cp{self.cp}" + (" a2a" if self.cp_comm == "a2a" else ""))
        if self.zero:
            parts.append(f"zero{self.zero}")
        if self.dp_shard:
            parts.append(f"hsdp{self.replicate}x{self.dp_shard}")
        if self.sequence_parallel:
            parts.append("sp")
        if self.expert_parallel > 1:
            parts.append(f"ep{self.expert_parallel}")
        if self.expert_tensor_parallel is not None:
            parts.append(f"etp{self.expert_tensor_parallel}")
        parts.append(f"recompute={self.recompute.value}")
        parts.append(f"mb{self.micro_batch}x{self.num_microbatches}")
        parts.append(self.schedule.value + (f"(v={self.virtual_stages})" if self.virtual_stages > 1 else ""))
        if self.tp_comm_overlap:
            parts.append("tp-comm-overlap")
        if self.overlap_param_gather:
            parts.append("overlap-param-gather")
        if not self.overlap_grad_reduce:
            parts.append("no-overlap-grad-reduce")
        if self.pp_scatter_gather:
            parts.append("pp-scatter-gather")
        if self.optimizer_offload:
            parts.append(f"offload={self.optimizer_offload:g}")
        return " ".join(parts)


def data_parallel_degrees(degrees: list[int], global_batch: int, micro_batch: int | None) -> list[int]:
    """The data-parallel degrees among ``degrees`` a search considers at this batch: each replica runs
    ``global_batch / (micro_batch x dp)`` micro-batches of ``micro_batch`` samples, so with a
    ``micro_batch`` given only the ``dp`` for which ``global_batch`` is a multiple of
    ``micro_batch x dp`` (none: the request is refused); all of them without one."""
    return [d for d in degrees if micro_batch is None or global_batch % (micro_batch * d) == 0]


def microbatches_for(global_batch: int, micro_batch: int, dp: int) -> int:
    """Micro-batches per replica for a global batch; StrategyError unless it divides exactly."""
    per = micro_batch * dp
    if global_batch <= 0 or global_batch % per:
        raise StrategyError(f"global batch {global_batch} is not a multiple of micro-batch {micro_batch} "
                            f"x data-parallel degree {dp} = {per}")
    return global_batch // per


@dataclass(frozen=True)
class SplitDims:
    """The sizes of the dims the parallel degrees split in one model (each dim's first size in the
    graph): the one rule every strategy obeys, whether a user gives it (``parplan memory``) or a
    search generates it (the uniform families, the DP's per-layer space). TP splits the attention
    heads, the key/value heads and the MLP's hidden units; sequence parallelism splits the sequence
    over the TP ranks; expert parallelism splits the experts. Each degree must divide what it splits
    (Megatron-LM asserts it: ``num_attention_heads % tensor_model_parallel_size``,
    ``num_query_groups % tensor_model_parallel_size``, ``seq_length % tensor_model_parallel_size``
    with ``--sequence-parallel``, ``num_moe_experts % expert_model_parallel_size``). The vocabulary is
    not in it: the trainers pad it to a multiple of the TP degree."""

    sizes: tuple[tuple[str, int], ...]  # every size (above 1) a split dim has, in graph order

    @classmethod
    def of(cls, graph: Graph) -> SplitDims:
        """The graph's split dims, computed once per graph (kept in its ``memo``)."""
        found = graph.memo.get("split_dims")
        if not isinstance(found, SplitDims):
            found = graph.memo["split_dims"] = cls._of(graph)
        return found

    @classmethod
    def _of(cls, graph: Graph) -> SplitDims:
        sizes: dict[tuple[str, int], None] = {}
        for n in graph.nodes:
            for d, s in n.dims:
                if d in (*TP_SPLIT_DIMS, *SEQ_DIMS, "expert") and (s > 1 or not any(k == d for k, _ in sizes)):
                    sizes.setdefault((d, s))
        return cls(tuple(sizes))

    def problem(self, tp: int = 1, sp: bool = False, ep: int = 1) -> str | None:
        """Why ``tp`` (with sequence parallelism ``sp``) and ``ep`` cannot split this model; None when they can.
        A dim of several sizes (a dense MLP's ``ffn`` and the experts') must split at each."""
        for d, size in self.sizes:
            if d in TP_SPLIT_DIMS and size % tp:
                return f"tp={tp} does not divide {d} ({size})"
        if sp:
            for d, size in self.sizes:
                if d in SEQ_DIMS and size % tp:
                    return f"sequence parallel tp={tp} does not divide {d} ({size})"
        sizes = dict(self.sizes)
        if ep > 1:
            if "expert" not in sizes:
                return "expert parallelism needs a model with experts"
            if sizes["expert"] % ep:
                return f"ep={ep} does not divide the {sizes['expert']} experts"
        return None

    def allows(self, tp: int = 1, sp: bool = False, ep: int = 1) -> bool:
        return self.problem(tp, sp, ep) is None


def check_divisibility(graph: Graph, cfg: ParallelConfig) -> None:
    """StrategyError when TP/SP/EP/CP degrees do not divide the dims they split (:class:`SplitDims`)."""
    problem = SplitDims.of(graph).problem(cfg.tp, cfg.sequence_parallel, cfg.expert_parallel)
    if problem is not None:
        raise StrategyError(problem)
    if cfg.cp > 1:
        check_context_parallel(graph, cfg.cp, cfg.cp_comm, cfg.tp)


def check_context_parallel(graph: Graph, cp: int, comm: str = "p2p", tp: int = 1) -> None:
    """StrategyError unless ``graph`` can be context-parallel over ``cp`` ranks: every attention is
    self-attention over ``seq`` (keys over the same sequence as the queries), and the sequence splits
    into ``2 * cp`` equal chunks (each rank holds two, one from each end, to balance causal work).
    The all-to-all exchange (``comm`` a2a) splits each TP rank's query and key heads over ``cp``."""
    seq = int(graph.meta.get("seq_len", 0) or 0)
    for n in graph.nodes:
        if n.kind is OpKind.ATTENTION:
            q, k = graph.node(n.inputs[0]), graph.node(n.inputs[1])
            if "seq" not in q.shape or "seq" not in k.shape:
                raise StrategyError(f"context parallelism needs self-attention over the sequence; {n.id!r} is not "
                                    f"(its queries are over {list(q.shape)}, its keys over {list(k.shape)})")
            seq = q.shape["seq"]
            if comm == "a2a":
                for what, t in (("query", q), ("key", k)):
                    heads = next((t.shape[d] for d in ("heads", "kv_heads") if d in t.shape), 0)
                    if heads % (tp * cp):
                        raise StrategyError(f"the all-to-all context parallelism splits {what} heads over tp x cp = "
                                            f"{tp * cp}; {n.id!r} has {heads}")
    if not seq or seq % (2 * cp):
        raise StrategyError(f"context parallelism cp={cp} needs the sequence length ({seq}) to be a multiple of "
                            f"2 x cp = {2 * cp}")

"""Targets: the trainer a plan is for, what it can run, whose buffers it keeps, its own baseline.

- ``any``: every plan either search finds (the default);
- ``megatron``: Megatron-LM's uniform strategies: TP inside a node (with or without sequence
  parallelism), PP (1F1B, or interleaved with 2 or 4 chunks per device), DP with or without the
  distributed optimizer (ZeRO-1; over a data-parallel group spanning nodes also sharded within each
  node and replicated across them, ``--num-distributed-optimizer-instances``), expert parallelism
  for MoE models, no or full recomputation
  (selective without flash attention: with it, Megatron-LM's selective recomputation keeps the same
  buffers as none and reruns the attention core, :func:`~parplan.solver.cost.rules.search_recomputes`),
  and the ``--recompute-modules`` sets of :func:`~parplan.solver.cost.rules.module_recomputes`;
  priced with Megatron-LM's buffers;
- ``torchtitan``: FSDP2 (ZeRO-3, or ZeRO-2 without resharding after forward; over a data-parallel
  group spanning nodes also HSDP, sharded within each node and replicated across them:
  ``data_parallel_shard_degree`` x ``data_parallel_replicate_degree``) or replicated data
  parallelism (FSDP2's replicate), TP with or without sequence parallelism, PP (1F1B or
  interleaved), no, per-operator (its ``selective``) or full recomputation; priced with the
  ``torchtitan`` runtime (PyTorch-native buffers, fp32 weights as the master copy, gradients freed
  between steps; its exports run Llama 3 models only: the sizes of its registry);
- ``deepspeed``: the DeepSpeed engine's data parallelism, ZeRO 0-3, no TP or PP (those need the
  model's own code); priced with the ``deepspeed`` runtime (Megatron-LM's data-parallel buffers,
  PyTorch's loss, its communication buckets as set by the export);
- ``galvatron``: per-layer hybrid strategies, which the DP search (Galvatron's own space) returns;
- ``nanotron``: Hugging Face's nanotron trainer: TP inside a node (``tp_mode`` ALL_REDUCE or
  REDUCE_SCATTER, its sequence parallelism), PP with its 1F1B or all-forward-all-backward engine and
  its own split of the layers (:func:`~parplan.solver.cost.nanotron.partition_of`), DP with ZeRO 0 or
  1, no or full recomputation (``recompute_layer``); priced with the ``nanotron`` runtime;
- ``parplan``: what the validation agent runs (``parplan validate --plan``): the ILP's per-operator
  plans (DTensor) and the uniform baselines, priced with PyTorch-native buffers (the agent's).

A uniform target is searched exhaustively over its strategies (:func:`family`), each priced by the
whole-plan evaluator, so its answer is never beaten on both memory and time by its baseline, which
is one of them.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Iterator
from dataclasses import dataclass, replace
from enum import StrEnum

from parplan.solver.baselines import Candidate, enumerate_uniform, micro_batch_choices
from parplan.solver.cluster import Cluster
from parplan.solver.cost.pipeline import blocks_of
from parplan.solver.cost.rules import module_recomputes, search_recomputes
from parplan.solver.cost.runtime import Runtime
from parplan.solver.errors import SolverError, StrategyError
from parplan.solver.ir import Graph
from parplan.solver.strategy import ParallelConfig, Schedule, check_schedule


class Target(StrEnum):
    ANY = "any"
    MEGATRON = "megatron"
    TORCHTITAN = "torchtitan"
    DEEPSPEED = "deepspeed"
    GALVATRON = "galvatron"
    PARPLAN = "parplan"
    NANOTRON = "nanotron"


@dataclass(frozen=True)
class TargetSpec:
    """How a target is planned: ``uniform`` targets by exhaustive search over :func:`family`,
    the others by the named searches; ``runtime`` prices the buffers; ``baseline`` is the
    baseline the answer is measured against (a name in :data:`parplan.solver.baselines.BASELINES`)."""

    runtime: Runtime
    uniform: bool
    searches: tuple[str, ...]
    baseline: str
    unpriced: tuple[str, ...] = ()  # what the trainer holds that the prediction leaves out (said in the plan)


SPECS: dict[Target, TargetSpec] = {
    Target.ANY: TargetSpec(Runtime.MEGATRON, False, ("auto", "ilp", "dp"), "megatron"),
    Target.MEGATRON: TargetSpec(Runtime.MEGATRON, True, ("uniform",), "megatron"),
    Target.TORCHTITAN: TargetSpec(Runtime.TORCHTITAN, True, ("uniform",), "zero3"),
    Target.DEEPSPEED: TargetSpec(Runtime.DEEPSPEED, True, ("uniform",), "zero3", (
        "DeepSpeed's buckets are priced as an upper bound set by the export (50M elements each for "
        "reduce_bucket_size, allgather_bucket_size and ZeRO-3's prefetch bucket and live parameters), not "
        "measured; a config with larger buckets holds more",)),
    Target.GALVATRON: TargetSpec(Runtime.MEGATRON, False, ("dp",), "megatron"),
    Target.PARPLAN: TargetSpec(Runtime.TORCH, False, ("ilp",), "megatron"),
    Target.NANOTRON: TargetSpec(Runtime.NANOTRON, True, ("uniform",), "megatron", (
        "the updated weights' all-gather under ZeRO-1 and DDP's bucket rebuild in the second step (each below "
        "the end of a backward)",)),
}


#: Model chunks per device tried under the interleaved schedule.
VIRTUAL_STAGES = (2, 4)


def data_parallel_choices(target: Target, devices: int) -> list[int]:
    """The data-parallel degrees the target's search can give ``devices`` GPUs: all of them for
    DeepSpeed (no TP or PP), any divisor for the others."""
    if target is Target.DEEPSPEED:
        return [devices]
    return [d for d in range(1, devices + 1) if devices % d == 0]


def family(target: Target, cluster: Cluster, global_batch: int, num_blocks: int,
           experts: int = 0, micro_batch: int | None = None) -> Iterator[Candidate]:
    """Every uniform strategy the target runs on the cluster at this global batch (``experts``: the
    model's experts per MoE layer, 0 for a dense model; ``micro_batch``: the one given, else searched)."""
    node = cluster.gpus_per_node
    rcs = search_recomputes(SPECS[target].runtime, ParallelConfig.flash_attention)
    mbs = micro_batch_choices(micro_batch)
    if target is Target.MEGATRON:
        # with Megatron-LM's --recompute-modules sets between none and full
        sets = module_recomputes(SPECS[target].runtime, ParallelConfig.flash_attention, experts > 0)
        for c in enumerate_uniform(cluster, global_batch, num_blocks, zeros=(0, 1), recomputes=(*rcs, *sets),
                                   micro_batches=mbs):
            # pipeline stages of equal layer counts (the even split Megatron-LM makes; parplan's uneven
            # split of other counts is not one it runs)
            if node % c.tp == 0 and num_blocks % c.pp == 0:
                yield from _with_schedules_and_experts(c, global_batch, num_blocks, experts, node)
    elif target is Target.TORCHTITAN:
        for c in enumerate_uniform(cluster, global_batch, num_blocks, zeros=(0, 2, 3), recomputes=rcs,
                                   micro_batches=mbs):
            # ZeRO-0 is torchtitan's replicate (FSDP2 over a shard group of one), as the torchtitan
            # runtime prices it
            if node % c.tp == 0:
                yield from _with_schedules_and_experts(c, global_batch, num_blocks, 0, node, zero_bubble=True)
    elif target is Target.NANOTRON:
        for c in enumerate_uniform(cluster, global_batch, num_blocks, zeros=(0, 1), recomputes=rcs):
            # its engines: 1F1B (at least pp - 1 micro-batches) and all-forward-all-backward; the layers
            # split as nanotron splits them (UniformEvaluator.config)
            microbatches = global_batch // (c.micro_batch * c.dp)
            if node % c.tp == 0:
                if c.pp == 1 or microbatches >= c.pp - 1:
                    yield c
                if c.pp > 1:
                    yield replace(c, schedule=Schedule.GPIPE)
    elif target is Target.DEEPSPEED:
        yield from enumerate_uniform(cluster, global_batch, num_blocks, tp_max=1, pp_choices=(1,), recomputes=rcs,
                                     micro_batches=mbs)
    else:
        raise SolverError(f"target {target.value} is not searched over uniform strategies")


def shard_groups(c: Candidate, node: int, ep: int = 1) -> tuple[int, ...]:
    """The shard groups searched for ``c`` (:attr:`Candidate.dp_shard`): ZeRO over all of dp (0)
    and, with ZeRO sharding and a data-parallel group that spans nodes, over the data-parallel
    ranks of one node (``node / tp``, the expert-parallel ranks inside it), replicated across the
    nodes: the hybrid sharding that keeps the sharded collectives on the intra-node link. Other
    divisors of dp are not searched (each would price the whole family again)."""
    local = node // c.tp
    if c.zero and 1 < local < c.dp and c.dp % local == 0 and local % ep == 0:
        return (0, local)
    return (0,)


def _with_schedules_and_experts(c: Candidate, global_batch: int, num_blocks: int, experts: int, node: int,
                                zero_bubble: bool = False) -> Iterator[Candidate]:
    """``c`` and its variants: interleaved pipelines (``v`` chunks per device, the layers splitting
    evenly over the chunks), with ``zero_bubble`` (torchtitan) the zero-bubble schedules too
    (``interleaved-zb`` on 2 or 4 chunks per device, as torchtitan builds a multi-stage schedule with
    at least 2; ``zbv`` and ``dualpipev`` on 2), each where its runtime runs it at this micro-batch
    count (:func:`~parplan.solver.strategy.check_schedule`); expert parallelism over part of the
    data-parallel group and hybrid sharding over a node's data-parallel ranks (:func:`shard_groups`;
    ``node``: GPUs per node)."""
    microbatches = global_batch // (c.micro_batch * c.dp)
    tried = [(Schedule.ONE_F_ONE_B, 1)]
    if c.pp > 1:
        tried += [(Schedule.INTERLEAVED, v) for v in VIRTUAL_STAGES if num_blocks % (c.pp * v) == 0]
    if c.pp > 1 and zero_bubble:
        tried += [(Schedule.INTERLEAVED_ZB, v) for v in VIRTUAL_STAGES if num_blocks % (c.pp * v) == 0]
        if num_blocks % (2 * c.pp) == 0:
            tried += [(Schedule.ZBV, 2), (Schedule.DUALPIPEV, 2)]
    runtime = Runtime.TORCHTITAN if zero_bubble else Runtime.MEGATRON
    schedules = [(s, v) for s, v in tried if _runs(s, runtime, c.pp, microbatches, v)]
    eps = [e for e in range(1, c.dp + 1) if c.dp % e == 0 and (e == 1 or (experts and experts % e == 0))]
    for schedule, v in schedules:
        for ep in eps:
            for shard in shard_groups(c, node, ep):
                yield replace(c, schedule=schedule, virtual=v, ep=ep, dp_shard=shard)


def _runs(schedule: Schedule, runtime: Runtime, pp: int, microbatches: int, virtual: int) -> bool:
    """Whether ``runtime`` runs ``schedule`` on ``pp`` stages, ``microbatches`` and ``virtual`` chunks."""
    try:
        check_schedule(schedule, runtime, pp, microbatches, virtual)
    except StrategyError:
        return False
    return True


#: Fractions of the optimizer a target's search offloads, when none of its strategies fits without
#: (Megatron-LM's --optimizer-offload-fraction; DeepSpeed's offload_optimizer moves all of it).
OFFLOAD_FRACTIONS: dict[Target, tuple[float, ...]] = {Target.MEGATRON: (0.5, 1.0), Target.DEEPSPEED: (1.0,)}


def offload_variants(target: Target, cands: Iterable[Candidate]) -> list[Candidate]:
    """The target's strategies with part of the optimizer on the host (:data:`OFFLOAD_FRACTIONS`), for
    those that can offload: Megatron-LM's under its distributed optimizer (ZeRO-1; a plan without data
    parallelism takes it too), DeepSpeed's under ZeRO 1-3."""
    out: list[Candidate] = []
    for f in OFFLOAD_FRACTIONS.get(target, ()):
        for c in cands:
            if target is Target.MEGATRON and (c.zero == 1 or c.dp == 1):
                out.append(replace(c, zero=1, offload=f))
            elif target is Target.DEEPSPEED and c.zero >= 1:
                out.append(replace(c, offload=f))
    return out


class _GalvatronRuns:
    """The uniform strategies Galvatron runs: no ZeRO-1, no expert parallelism, no interleaving, no
    hybrid sharding."""

    def __contains__(self, c: object) -> bool:
        return isinstance(c, Candidate) and c.zero != 1 and c.ep == 1 and c.virtual == 1 and not c.dp_shard


def runnable(target: Target, cluster: Cluster, global_batch: int, graph: Graph,
             micro_batch: int | None = None) -> Container[Candidate] | None:
    """The uniform strategies the target runs for the model of ``graph`` (one micro-batch's): the
    whole :func:`family` of a uniform target, a test for Galvatron's, None for any."""
    if target is Target.GALVATRON:
        return _GalvatronRuns()
    if not SPECS[target].uniform:
        return None
    experts = max((size for n in graph.nodes for d, size in n.dims if d == "expert"), default=0)
    return set(family(target, cluster, global_batch, len(blocks_of(graph)), experts, micro_batch))

"""Once-per-step data-parallel work of a unit under a :class:`~.layer_plan.LayerPlan`.

Each unit's gradient synchronisation over its data-parallel group, hidden behind that unit's
backward of one micro-batch as far as it lasts (ZeRO-3's per-micro-batch weight gathers behind
that micro-batch's compute), the compute slowed meanwhile by the SMs the collective holds
(:func:`~parplan.solver.cost.rules.hidden_traffic_seconds`), and the copies the runtime's sharded
data parallelism makes around its collectives. Pure functions of their arguments; the mesh and
links come from the memo layer (:class:`~.plan_structure.Links`).
"""

from __future__ import annotations

from collections.abc import Iterable

from parplan.solver.cost.collectives import (
    DataParallelTraffic,
    all_reduce_seconds,
    data_parallel_seconds,
    hybrid_data_parallel_seconds,
)
from parplan.solver.cost.kernels import collective_sm_share
from parplan.solver.cost.layer_plan import LayerPlan, LayerStrategy, group_ranks, replicate_ranks, shard_ranks
from parplan.solver.cost.plan_structure import Links, replicate_link
from parplan.solver.cost.precision import Precision
from parplan.solver.cost.rules import (
    data_parallel_collectives,
    exposed_seconds,
    sharded_copy_seconds,
    weight_gather_exposed_seconds,
)
from parplan.solver.cost.units import OwnedParam, UnitCost


def sync_seconds(p: Links, plan: LayerPlan, s: LayerStrategy, params: Iterable[OwnedParam], prec: Precision,
                 unit_numel: float) -> DataParallelTraffic:
    """The data-parallel traffic (:class:`DataParallelTraffic`) of one operator's parameters,
    synchronised together: over their data-parallel group (dense: ``dp x cp`` ranks,
    experts: ``dp x cp / ep``; under hybrid sharding within the shard group and across the
    replicate one, :func:`hybrid_data_parallel_seconds`), in the collectives the runtime groups them into
    (:func:`data_parallel_collectives`; ``unit_numel``: the elements of the parameters the unit
    reads, whose one collective the operator shares), and those TP replicates while the
    operator's work is split all-reduced over TP."""
    tensors: dict[bool, list[float]] = {False: [], True: []}  # each parameter's local elements
    numel = {False: 0.0, True: 0.0}
    sent = {False: 0.0, True: 0.0}  # bytes a gather of the weights sends (Precision.transfer_bytes)
    tp_partial = 0.0
    for param in params:
        tensors[param.group.expert].append(param.elems)
        numel[param.group.expert] += param.numel
        sent[param.group.expert] += param.elems * prec.transfer_bytes(param.float8)
        tp_partial += param.elems if param.tp_partial else 0.0
    reduce = weight_gather = gathers = 0.0
    for expert, local in tensors.items():
        n, e = group_ranks(s, expert), sum(local)
        if n > 1 and e:
            count = data_parallel_collectives(plan.runtime, s.tp, n, s.zero, local, prec.grad_bytes,
                                              numel[expert] / unit_numel if unit_numel else 0.0)
            link = p.data_link(plan, s, expert)
            weights = sent[expert]
            if s.dp_shard:
                traffic = hybrid_data_parallel_seconds(shard_ranks(s, expert), replicate_ranks(s), e * prec.grad_bytes,
                                                       weights, s.zero, link,
                                                       replicate_link(p.cluster, p.mesh(plan, s), s), count)
            else:
                traffic = data_parallel_seconds(n, e * prec.grad_bytes, weights, s.zero, link, count)
            reduce += traffic.reduce
            weight_gather += traffic.weight_gather
            gathers += traffic.gathers
    if tp_partial:
        tp_link = p.mesh(plan, s).link("tp", p.cluster)
        reduce += all_reduce_seconds(s.tp, tp_partial * prec.grad_bytes, tp_link)
    return DataParallelTraffic(reduce, weight_gather, gathers)


def copy_seconds(p: Links, plan: LayerPlan, s: LayerStrategy, params: Iterable[OwnedParam], prec: Precision,
                 reductions: int) -> float:
    """Seconds per step of the copies the runtime's sharded data parallelism makes around the
    collectives of these parameters (:func:`sharded_copy_seconds`), ``reductions`` times a step."""
    elems = {False: 0.0, True: 0.0}
    sent = {False: 0.0, True: 0.0}
    for param in params:
        elems[param.group.expert] += param.elems
        sent[param.group.expert] += param.elems * prec.transfer_bytes(param.float8)
    return sum(sharded_copy_seconds(plan.runtime, s.tp, group_ranks(s, expert), s.zero, e, prec,
                                    p.cluster.gpu, p.calibration, plan.num_microbatches, reductions, sent[expert])
               for expert, e in elems.items())


def gathers_under_forward(plan: LayerPlan, s: LayerStrategy) -> bool:
    """Whether ZeRO 1-2's gather of the updated weights runs under the next forward: with
    Megatron-LM's ``--overlap-param-gather``, and where the runtime gathers each unit's weights
    before its forward (FSDP without resharding); else after the optimizer step."""
    return plan.overlap_param_gather or plan.runtime.data_parallel(s.tp, s.data_ranks, s.zero).gathers


def once_per_step(p: Links, plan: LayerPlan, c: UnitCost, s: LayerStrategy, prec: Precision, synced: set[str],
                  own: bool = True, shared: bool = True) -> tuple[float, float]:
    """(gradient traffic, of it what overlap does not hide, with the runtime's copies around the
    collectives, :func:`copy_seconds`) of the parameters ``c``'s operators own, each operator's
    overlapped with its own backward; a shared parameter only the first time (``synced`` collects
    them). ``own`` / ``shared``: which parameters to count."""
    total = exposed = 0.0
    m = plan.num_microbatches
    # gradient syncs per step
    every = m if plan.sync_every_microbatch or plan.runtime.reduces_every_microbatch(plan.pp > 1) else 1
    slowdown = collective_sm_share(p.cluster.gpu)
    for op in c.owners:
        params = [q for q in op.params if (shared and q.shared and q.id not in synced) or (own and not q.shared)]
        synced.update(q.id for q in params if q.shared)
        t = sync_seconds(p, plan, s, params, prec, c.param_numel)
        total += every * t.sync + m * t.gathers
        exposed += copy_seconds(p, plan, s, params, prec, every)  # on the compute's HBM: never hidden
        if not plan.overlap_grad_reduce:
            # Megatron-LM without --overlap-grad-reduce: the reduction (with the distributed
            # optimizer, its weight all-gather too) runs after the backward, none of it hidden
            exposed += every * (t.sync + exposed_seconds(0.0, t.gathers, op.forward_seconds,
                                                         op.backward_seconds, m // every, slowdown=slowdown))
        else:
            exposed += every * (exposed_seconds(t.reduce, t.gathers, op.forward_seconds, op.backward_seconds,
                                                m // every, slowdown=slowdown)
                                + weight_gather_exposed_seconds(t.weight_gather, op.forward_seconds,
                                                                gathers_under_forward(plan, s),
                                                                slowdown=slowdown))
    return total, exposed

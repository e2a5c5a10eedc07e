"""Rules of one operator and one parameter, shared by the whole-plan evaluator and the ILP.

Every price a search sees comes through these functions, whichever way the search groups
operators (the evaluator by unit and per-unit strategy, the ILP by operator and per-operator
strategy):

- :func:`op_seconds`: an operator's forward, backward and recomputed-forward roofline time on the
  devices its work is split over, at its kernel's efficiency on one device's shape;
- :func:`parameter_states`: weights, gradients and optimizer states of parameter elements that
  ``replicas`` devices hold a copy of, with ZeRO sharding over ``zero_ranks`` of them;
- :func:`exposed_seconds`: the part of gradient synchronisation (once per step) and of ZeRO-3's
  weight gathers (every micro-batch) that the backward (and forward) compute does not hide;
- :func:`optimizer_step_seconds`: Adam's memory-bound update of what a device holds;
- :func:`sharded_copy_seconds`: FSDP2's copies around its all-gathers and reduce-scatters;
- :func:`data_parallel_collectives`: how many data-parallel collectives an operator's parameters
  account for (their latency), from how the runtime groups parameters into collectives.
"""

from __future__ import annotations

from collections.abc import Sequence

from parplan.solver.calibration import Calibration
from parplan.solver.cluster import GpuSpec
from parplan.solver.cost import recompute_modules
from parplan.solver.cost.activations import LOSS_BYTES, Recompute, block_of, fp8_gemm_weights, is_float, op_sac_saved
from parplan.solver.cost.collectives import DP_BUCKET_BYTES
from parplan.solver.cost.compute import backward_flops, bytes_moved, forward_flops
from parplan.solver.cost.compute import op_seconds as roofline_seconds
from parplan.solver.cost.kernels import (
    FP8_AMAX_BYTES,
    FP8_CAST_BYTES,
    GEMM_SCORE_PASSES,
    SOFTMAX_SCORE_PASSES,
    attention_efficiency,
    attention_kernel,
    flash_attention_shape,
    fp8_cast_bytes,
    gemm_ceiling,
    gemm_efficiency,
    gemm_group,
    gemm_shape,
    grouped_gemm_shape,
    memory_efficiency,
    memory_library,
    unfused_attention_gemms,
    unfused_score_bytes,
    unfused_scores,
)
from parplan.solver.cost.memory import MemoryBreakdown
from parplan.solver.cost.op_layout import Mesh, OpStrategy, input_layout, loop_dims, output_layout, work_shards
from parplan.solver.cost.precision import Precision
from parplan.solver.cost.runtime import DEEPSPEED_BUCKET_ELEMENTS, Runtime
from parplan.solver.ir import Graph, Node, OpKind


def compute_dtype(node: Node, prec: Precision, graph: Graph | None = None) -> str:
    """The dtype ``node``'s arithmetic runs in: the training precision's for floats; its
    ``matmul_dtype`` (FP8) for a matmul with a weight of ``graph`` that has no vocabulary dim."""
    if not is_float(node):
        return node.dtype
    if prec.matmul_dtype and graph is not None:
        weights = fp8_gemm_weights(node, graph)
        if weights and (not prec.torchao or all(_float8_linear(w, node, graph) for w in weights)):
            return prec.matmul_dtype
    return prec.compute_dtype


def _float8_linear(weight: Node, matmul: Node, graph: Graph) -> bool:
    """torchtitan converts a linear layer whose in- and out-features are multiples of 16 (FP8 tensor
    cores' alignment; torchtitan/components/quantization/utils.py: ``module_filter_fn``): here the
    weight's dims the matmul's input shares, and the rest. A weight with an expert dim is not
    converted: the experts are torchtitan's ``GroupedExperts``, not linear layers (another converter,
    not modelled), and its MoE configs filter the router (``filter_fqns``)."""
    if "expert" in weight.shape:
        return False
    read = {d for i in matmul.inputs if i != weight.id for d, _ in graph.node(i).dims}
    fan_in = 1
    for d, size in weight.dims:
        fan_in *= size if d in read else 1
    return fan_in % 16 == 0 and (weight.numel // fan_in) % 16 == 0


def float8_weight(param: Node, graph: Graph, consumers: Sequence[str]) -> bool:
    """Whether ``param`` is the weight of a linear layer torchao's Float8 training converts (its GEMMs
    at ``matmul_dtype``, :func:`compute_dtype`; FSDP2 may gather it in float8): read by matmuls, no
    vocabulary dim (the output layer stays bf16), features multiples of 16. ``consumers``: the ids of
    the nodes reading it."""
    readers = [graph.node(c) for c in consumers]
    return ("vocab" not in param.shape and bool(readers)
            and all(r.kind is OpKind.EINSUM and _float8_linear(param, r, graph) for r in readers))


def recomputed(node: Node, recompute: Recompute, flash_attention: bool, runtime: Runtime, graph: Graph) -> bool:
    """Whether backward runs ``node``'s forward again: every operator of a block under full
    recomputation, those whose outputs the policy does not save under per-operator checkpointing
    (:func:`~.activations.op_sac_saved`: the saved ones are replayed from its cache, ``graph`` the
    node's); the attention core under selective recomputation, without flash attention or in a
    runtime that checkpoints a flash core too (:attr:`Runtime.recomputes_flash_core`); under a
    Megatron-LM module set, the operators of its checkpointed modules too (:mod:`~.recompute_modules`)."""
    if recompute is Recompute.FULL:
        return block_of(node) is not None
    if recompute is Recompute.OP:
        return block_of(node) is not None and not op_sac_saved(node, graph, runtime)
    if recompute.per_module and node.id in recompute_modules.regions(
            graph, recompute.modules, runtime.fuses_norms).region:
        return True
    return (recompute.core_attention and node.kind is OpKind.ATTENTION
            and (not flash_attention or runtime.recomputes_flash_core))


def search_recomputes(runtime: Runtime, flash_attention: bool, full: bool = True) -> tuple[Recompute, ...]:
    """The recomputations a search offers a block, the lighter first, then (``full``) per-operator
    recomputation where the runtime runs it (:attr:`Runtime.per_operator_checkpointing`), then full
    recomputation. The lighter is selective recomputation, or none where selective would keep the same
    buffers and still run the attention core again: a flash kernel (it keeps no scores) in a runtime
    that keeps K and V as they are and checkpoints the core (:attr:`Runtime.recomputes_flash_core`:
    Megatron-LM). There selective only adds time, so a plan with it is never the better one. A runtime
    without selective recomputation (:attr:`Runtime.selective_recomputation`) offers none instead."""
    light = (Recompute.NONE if (flash_attention and runtime.recomputes_flash_core and not runtime.repeats_kv_heads)
             or not runtime.selective_recomputation else Recompute.SELECTIVE)
    if not full:
        return (light,)
    return (light, Recompute.OP, Recompute.FULL) if runtime.per_operator_checkpointing else (light, Recompute.FULL)


def module_recomputes(runtime: Runtime, flash_attention: bool, moe: bool) -> tuple[Recompute, ...]:
    """Megatron-LM's module sets (:mod:`~.recompute_modules`) a search offers beside
    :func:`search_recomputes`, each between none and full recomputation in memory and time: a dense
    model's ``mlp`` (drops the MLP's activations, the bulk of a layer's); a mixture of experts'
    ``moe_act`` (the experts' activation, rerun cheaply: DeepSeek-V3's setting in Megatron-Bridge's
    recipes) and ``moe_act`` with ``layernorm`` (the pre-MLP norm's output too). ``moe`` (the whole
    MoE layer, its all-to-alls rerun) is not offered: it reruns nearly what full recomputation does
    and would cost the search a fifth policy. ``core_attn`` joins them where selective recomputation
    is the lighter policy (a core that keeps its scores). None outside the megatron runtime."""
    if runtime is not Runtime.MEGATRON:
        return ()
    core = search_recomputes(runtime, flash_attention, full=False)[0].modules
    sets = ((("moe_act",), ("moe_act", "layernorm")) if moe else (("mlp",),))
    return tuple(Recompute.of_modules(core | set(m)) for m in sets)


def op_seconds(node: Node, graph: Graph, gpu: GpuSpec, calibration: Calibration, prec: Precision, s: OpStrategy,
               mesh: Mesh, recompute: Recompute, flash_attention: bool,
               runtime: Runtime = Runtime.MEGATRON) -> tuple[float, float, float]:
    """(forward, backward, recomputed forward) roofline seconds of one micro-batch of ``node`` under
    strategy ``s``: its FLOPs divided over the devices its work is split over, at the efficiency of
    its kernel on one device's shape (:mod:`~parplan.solver.cost.kernels`: a GEMM by its tiles and
    waves, attention by the kernel ``runtime`` calls, or unfused without ``flash_attention``), its
    memory traffic that of the pieces of its inputs and output one device holds (backward: twice
    both).

    The answer depends on the strategy only through how much each of the operator's dims is cut
    (the product of the sizes of the mesh axes assigned to it), so it is remembered on the graph
    by that: meshes of other shapes that cut the dims alike share it."""
    factors: dict[str, int] = {}
    for (_, size), d in zip(mesh.axes, s.assignment, strict=True):
        if d is not None:
            factors[d] = factors.get(d, 1) * size
    kernel = attention_kernel(runtime) if node.kind is OpKind.ATTENTION else ""
    flash = flash_attention or node.kind is not OpKind.ATTENTION
    # whose normalisation and softmax kernels run (an unfused attention's softmax too)
    library = memory_library(runtime) if node.kind in _LIBRARY_KINDS or not flash else ""
    grouped = runtime.fuses_projections and "gemm_group" in node.attrs
    cache = graph.memo.setdefault("op_seconds", {})
    key = (node.id, tuple(sorted(factors.items())), gpu, calibration, prec, flash, kernel, library, grouped)
    hit = cache.get(key) if graph.owns(node) else None
    if hit is None:
        hit = _op_seconds(node, graph, gpu, calibration, prec, s, mesh, factors, flash, kernel, library, grouped)
        if graph.owns(node):
            cache[key] = hit
    fwd, bwd = hit
    return fwd, bwd, fwd if recomputed(node, recompute, flash_attention, runtime, graph) else 0.0


#: Operator kinds whose memory-bound kernel depends on the runtime's library (:func:`memory_library`).
_LIBRARY_KINDS = frozenset({OpKind.LAYERNORM, OpKind.RMSNORM, OpKind.SOFTMAX, OpKind.CROSS_ENTROPY})


def cross_entropy_passes(library: str, activation_bytes: int) -> tuple[float, float, float, float]:
    """HBM bytes per logit element (one device's) of a runtime's cross entropy, which computes in
    fp32 (:data:`~parplan.solver.cost.activations.LOSS_BYTES`, as the memory model keeps its
    probabilities): (forward, forward softmax, backward, backward softmax), the softmax ones moved by
    a softmax kernel (at the fraction of the HBM peak a softmax reaches), the others by elementwise
    and row-reduction kernels. A 16-bit logit is cast up first and its gradient cast back down.

    - ``te`` (Megatron-LM's vocabulary-parallel cross entropy, unfused, as its
      ``VocabParallelCrossEntropy`` runs it): forward the cast, the row max (a read), the in-place
      subtraction of it, the in-place exponential (a read and a write each), the row sum (a read)
      and the in-place division (a read and a write); backward the in-place product with the
      output gradient (the target's entry aside);
    - ``torch`` (PyTorch's ``cross_entropy``, ``log_softmax`` then ``nll_loss``, on logits cast to
      fp32 as torchtitan's and Hugging Face's losses do): forward the cast and ``log_softmax`` (a
      softmax kernel: a read and a write); backward ``nll_loss``'s zeroed gradient (a write) and
      ``log_softmax``'s backward (two reads and a write, a softmax kernel)."""
    f = LOSS_BYTES
    cast_up = activation_bytes + f if activation_bytes != f else 0.0
    cast_down = f + activation_bytes if activation_bytes != f else 0.0
    if library == "te":
        return cast_up + 8 * f, 0.0, 2 * f + cast_down, 0.0
    return cast_up, 2 * f, f + cast_down, 3 * f


def _op_seconds(node: Node, graph: Graph, gpu: GpuSpec, calibration: Calibration, prec: Precision, s: OpStrategy,
                mesh: Mesh, cuts: dict[str, int], flash: bool, kernel: str, library: str,
                grouped: bool = False) -> tuple[float, float]:
    """(forward, backward) seconds of :func:`op_seconds`, priced afresh; ``grouped``: a GEMM at the
    efficiency of the one GEMM its group runs as (:func:`grouped_gemm_shape`), its own share of
    that GEMM's arithmetic."""
    dt = compute_dtype(node, prec, graph)
    work = work_shards(s, mesh)
    sizes = mesh.sizes
    partial = loop_dims(node, graph)[1]
    ins = [input_layout(node, pos, graph, s, mesh).shards(sizes) for pos in range(len(node.inputs))]
    traffic = bytes_moved(node, graph, prec.activation_bytes, ins, output_layout(node, s, mesh, partial).shards(sizes))
    calibrated = calibration.matmul_efficiency_for(dt)
    b_eff = memory_efficiency(gpu, node.kind.value, calibration, library)
    if node.kind is OpKind.ATTENTION and not flash:
        return _unfused_attention_seconds(node, graph, gpu, prec, dt, cuts, work, traffic,
                                          gemm_ceiling(gpu, dt, calibration), b_eff,
                                          memory_efficiency(gpu, OpKind.SOFTMAX.value, calibration, library))
    if node.kind is OpKind.CROSS_ENTROPY:
        logits = graph.node(node.inputs[0]).numel / ins[0]
        fwd_bytes, fwd_softmax, bwd_bytes, bwd_softmax = cross_entropy_passes(library, prec.activation_bytes)
        softmax_eff = memory_efficiency(gpu, OpKind.SOFTMAX.value, calibration, library)
        fwd = max(roofline_seconds(forward_flops(node, graph) / work, 0.0, gpu, dt, calibrated, b_eff),
                  roofline_seconds(0.0, logits * fwd_bytes, gpu, dt, calibrated, b_eff)
                  + roofline_seconds(0.0, logits * fwd_softmax, gpu, dt, calibrated, softmax_eff))
        bwd = max(roofline_seconds(backward_flops(node, graph) / work, 0.0, gpu, dt, calibrated, b_eff),
                  roofline_seconds(0.0, logits * bwd_bytes, gpu, dt, calibrated, b_eff)
                  + roofline_seconds(0.0, logits * bwd_softmax, gpu, dt, calibrated, softmax_eff))
        return fwd, bwd
    shape = grouped_gemm_shape(node, graph, cuts) if grouped else gemm_shape(node, graph, cuts)
    if shape is not None:
        m_eff = b_m_eff = gemm_efficiency(shape, gpu, gemm_ceiling(gpu, dt, calibration), dt)
    elif node.kind is OpKind.ATTENTION:
        head_dim, keys = flash_attention_shape(node, graph, cuts)
        m_eff = attention_efficiency(gpu, kernel, dt, calibrated, head_dim=head_dim, keys=keys)
        b_m_eff = attention_efficiency(gpu, kernel, dt, calibrated, backward=True, head_dim=head_dim, keys=keys)
    else:
        m_eff = b_m_eff = calibrated
    fwd = roofline_seconds(forward_flops(node, graph) / work, traffic, gpu, dt, m_eff, b_eff)
    bwd = roofline_seconds(backward_flops(node, graph) / work, 2 * traffic, gpu, dt, b_m_eff, b_eff)
    if dt == "fp8" and shape is not None:
        out_shards = output_layout(node, s, mesh, partial).shards(sizes)
        cast_in, cast_out = (_torchao_cast_seconds(node, graph, gpu, ins, out_shards, b_eff, prec.fp8_weight_gather)
                             if prec.torchao else
                             _fp8_cast_seconds(node, graph, gpu, ins, out_shards, b_eff, grouped,
                                               prec.fp8_current_scaling))
        fwd += cast_in
        bwd += cast_out
    return fwd, bwd


def _fp8_cast_seconds(node: Node, graph: Graph, gpu: GpuSpec, in_shards: list[int], out_shards: int, b_eff: float,
                      grouped: bool, current_scaling: bool = False) -> tuple[float, float]:
    """(forward, backward) seconds of an FP8 GEMM's casts, memory-bound kernels apart from it: its
    activation's before the forward (one cast for a group the runtime fuses, shared by its members)
    and its output gradient's before the backward's two GEMMs, each at :func:`fp8_cast_bytes` an
    element of one device's share (``current_scaling``: with the amax read). The weight's cast, once
    a step, and a cast fused into the norm before (Transformer Engine's LayerNormLinear) are not told
    apart: every activation is cast on its own, an upper bound."""
    per_elem = fp8_cast_bytes(gpu, current_scaling)
    bandwidth = gpu.hbm_bandwidth_bytes_per_s * b_eff
    pos = next((i for i, x in enumerate(node.inputs) if not graph.node(x).is_parameter), 0)
    share = 1 / len(gemm_group(node, graph)) if grouped else 1.0
    x_elems = graph.node(node.inputs[pos]).numel / in_shards[pos]
    return x_elems * per_elem * share / bandwidth, node.numel / out_shards * per_elem / bandwidth


def _torchao_cast_seconds(node: Node, graph: Graph, gpu: GpuSpec, in_shards: list[int], out_shards: int,
                          b_eff: float, weight_gathered_fp8: bool) -> tuple[float, float]:
    """(forward, backward) seconds of the casts around a torchao Float8 GEMM (eager,
    torchao/float8/float8_linear.py ``matmul_with_hp_or_float8_args``), each a dynamic per-tensor cast
    (:data:`FP8_CAST_BYTES` plus :data:`FP8_AMAX_BYTES` an element of one device's share): forward
    casts the input and the weight; backward casts the output gradient twice (for the input's and
    the weight's gradient GEMMs), the weight again and the saved high-precision input again. A weight
    FSDP2 gathered in float8 (``weight_gathered_fp8``) is cast before the all-gather, on its shard
    only, which is not counted."""
    per_elem = FP8_CAST_BYTES + FP8_AMAX_BYTES
    bandwidth = gpu.hbm_bandwidth_bytes_per_s * b_eff
    x_elems = w_elems = 0.0
    for i, x in enumerate(node.inputs):
        elems = graph.node(x).numel / in_shards[i]
        if graph.node(x).is_parameter:
            w_elems += 0.0 if weight_gathered_fp8 else elems
        else:
            x_elems += elems
    out = node.numel / out_shards
    return (x_elems + w_elems) * per_elem / bandwidth, (2 * out + w_elems + x_elems) * per_elem / bandwidth


def _unfused_attention_seconds(node: Node, graph: Graph, gpu: GpuSpec, prec: Precision, dt: str,
                               cuts: dict[str, int], work: int, traffic: float, ceiling: float,
                               b_eff: float, softmax_eff: float) -> tuple[float, float]:
    """(forward, backward) seconds of an attention without a fused kernel: QKᵀ and PV as batched
    GEMMs over every query-key pair (no K fill: their short K loops' output is the score matrix,
    whose writes and reads are priced as traffic), a roofline over their arithmetic and what they
    move (the operator's inputs and output, QKᵀ's write of the scores and PV's read of the
    probabilities), then the softmax's passes over the score matrix (its read and write, at the
    fraction of the HBM peak a softmax reaches, ``softmax_eff``) and dropout's
    (:func:`~parplan.solver.cost.kernels.unfused_score_bytes`, less the GEMMs' own).

    The backward, kernel by kernel as Megatron-LM's core attention runs it: four GEMMs (dP = dO·Vᵀ
    and dV = Pᵀ·dO, dQ = dS·K and dK = dSᵀ·Q: twice the forward's arithmetic, and their own four
    passes over the score matrix, dP's write, P's read and dS's two reads, besides twice the
    operator's traffic), dropout's backward (dP and the mask read, its gradient written), the
    softmax's (the probabilities and their gradient read, the scores' gradient written: three
    passes). Per score element in 16 bits, 19 bytes against the forward's 13."""
    qk, pv = unfused_attention_gemms(node, graph, cuts)
    gemms = sum(roofline_seconds(2.0 * g.batch * g.m * g.n * g.k, 0.0, gpu, dt,
                                 gemm_efficiency(g, gpu, ceiling, dt, fill=False), b_eff) for g in (qk, pv))
    n, a = unfused_scores(node, graph, work), prec.activation_bytes
    scores = unfused_score_bytes(node, graph, work, a)
    own = GEMM_SCORE_PASSES * n * a
    softmax = SOFTMAX_SCORE_PASSES * n * a
    dropout = scores - own - softmax  # its read and write and its mask (0 without dropout)
    io = roofline_seconds(0.0, traffic + own, gpu, dt, 1.0, b_eff)
    fwd = (max(gemms, io) + roofline_seconds(0.0, softmax, gpu, dt, 1.0, softmax_eff)
           + roofline_seconds(0.0, dropout, gpu, dt, 1.0, b_eff))
    io_back = roofline_seconds(0.0, 2 * traffic + 2 * own, gpu, dt, 1.0, b_eff)
    bwd = (max(2 * gemms, io_back) + roofline_seconds(0.0, 1.5 * softmax, gpu, dt, 1.0, softmax_eff)
           + roofline_seconds(0.0, dropout, gpu, dt, 1.0, b_eff))
    return fwd, bwd


def parameter_states(elems: float, prec: Precision, zero: int, zero_ranks: int, replicas: int,
                     shards_parameters: bool | None = None) -> tuple[MemoryBreakdown, MemoryBreakdown]:
    """(held, redundant) bytes per device of ``elems`` local parameter elements that ``replicas``
    devices hold before ZeRO, sharded over ``zero_ranks`` of them: optimizer states from ZeRO-1,
    gradients from ZeRO-2, weights from ZeRO-3 (or as ``shards_parameters`` says: PyTorch's ZeRO-2
    shards them too, see :meth:`~parplan.solver.cost.runtime.Runtime.data_parallel`)."""
    weights_sharded = zero >= 3 if shards_parameters is None else shards_parameters
    held: dict[str, float] = {}
    redundant: dict[str, float] = {}
    for cat, nbytes, sharded in (("parameters", prec.param_bytes, weights_sharded),
                                 ("gradients", prec.grad_bytes, zero >= 2),
                                 ("optimizer_states", prec.optimizer_state_bytes, zero >= 1)):
        h = elems * nbytes / (zero_ranks if sharded else 1)
        copies = replicas // zero_ranks if sharded else replicas
        held[cat] = h
        redundant[cat] = h * (1 - 1 / copies)
    return MemoryBreakdown(**held), MemoryBreakdown(**redundant)


def hidden_traffic_seconds(traffic_seconds: float, compute_seconds: float, slowdown: float) -> float:
    """Seconds of ``traffic_seconds`` of communication run under ``compute_seconds`` of compute that
    the pair adds to the compute: the traffic beyond the compute, and at least ``slowdown`` of the
    traffic (the share of the GPU's SMs its collective's kernels hold,
    :func:`~parplan.solver.cost.kernels.collective_sm_share`: the compute runs on the rest while
    both run).

    With the compute at ``1 − slowdown`` of its speed while the traffic runs, the pair takes
    ``max(traffic, compute + slowdown · traffic)``; this returns that less the compute."""
    if traffic_seconds <= 0:
        return 0.0
    return max(traffic_seconds - compute_seconds, slowdown * traffic_seconds)


def exposed_seconds(sync_seconds: float, gather_seconds: float, forward_seconds: float, backward_seconds: float,
                    microbatches: int, *, slowdown: float) -> float:
    """Seconds per step of data-parallel traffic that overlap does not hide, as DDP and FSDP overlap
    it. ``gather_seconds``: ZeRO-3's weight gathers of one micro-batch, half before its forward and
    half before its backward (each prefetched under the compute of that pass); ``sync_seconds``: the
    gradient reduction, once per ``microbatches``, during the backward of the last micro-batch, whose
    backward weight gather runs then too: the two share one backward's time (the same network
    links). ``backward_seconds`` counts what the backward pass runs (a recomputed forward too).
    ``slowdown``: the compute lost while the traffic runs (:func:`hidden_traffic_seconds`)."""
    half = gather_seconds / 2
    return (microbatches * hidden_traffic_seconds(half, forward_seconds, slowdown)
            + (microbatches - 1) * hidden_traffic_seconds(half, backward_seconds, slowdown)
            + hidden_traffic_seconds(sync_seconds + half, backward_seconds, slowdown))


def weight_gather_exposed_seconds(gather_seconds: float, forward_seconds: float, under_forward: bool, *,
                                  slowdown: float) -> float:
    """Seconds per step of ZeRO 1-2's all-gather of the updated weights that overlap does not hide.
    It waits for the optimizer step, so it runs whole after it, unless the runtime gathers the
    weights under the next step's forward (``under_forward``: Megatron-LM's
    ``--overlap-param-gather``, FSDP without resharding, which gathers each unit before its
    forward); ``slowdown`` as in :func:`hidden_traffic_seconds`."""
    return hidden_traffic_seconds(gather_seconds, forward_seconds, slowdown) if under_forward else gather_seconds


def sharded_copy_seconds(runtime: Runtime, tp: int, ranks: int, zero: int, elems: float, prec: Precision,
                         gpu: GpuSpec, calibration: Calibration, microbatches: int, reductions: int,
                         gathered_bytes: float | None = None) -> float:
    """Seconds per step of the copies sharded data parallelism makes on the GPU around its
    collectives (:attr:`~parplan.solver.cost.runtime.Runtime.copies_around_collectives`), for
    ``elems`` local weight elements synchronised over ``ranks`` data-parallel ranks. Memory bound
    and on the compute's HBM, so never hidden:

    - each all-gather (every micro-batch's forward, and its backward again where the weights are
      resharded after forward) reads its output and writes the unsharded weights: ``2 x elems x``
      the bytes a weight travels in;
    - each of the step's ``reductions`` reads the unsharded gradients (in the compute dtype) and
      writes the reduce-scatter's input in the reduce dtype (``prec.grad_bytes``).

    FSDP2 (PyTorch's ``fully_shard``) with ``tp`` x ``ranks`` devices; 0 for other runtimes, for
    ZeRO 0-1, or over one rank. ``gathered_bytes``: the bytes those weights travel in, when not
    ``elems x prec.weight_transfer_bytes`` (Float8 weights gathered in float8)."""
    dp = runtime.data_parallel(tp, ranks, zero)  # one rank: in place, nothing gathered
    if elems <= 0 or not runtime.copies_around_collectives or not (dp.shards_parameters and dp.gathers):
        return 0.0
    gathers = microbatches * (1 if dp.kept_from_forward else 2)
    weights = elems * prec.weight_transfer_bytes if gathered_bytes is None else gathered_bytes
    nbytes = gathers * 2 * weights + reductions * elems * (prec.activation_bytes + prec.grad_bytes)
    return nbytes / (gpu.hbm_bandwidth_bytes_per_s * calibration.memory_efficiency)


def optimizer_step_seconds(states: MemoryBreakdown, gpu: GpuSpec, calibration: Calibration) -> float:
    """Adam's update reads the gradients and optimizer states and writes the weights and states
    (memory bound)."""
    nbytes = states.gradients + 2 * states.optimizer_states + states.parameters
    return nbytes / (gpu.hbm_bandwidth_bytes_per_s * calibration.memory_efficiency)


def optimizer_temporary_bytes(largest_param_elems: float, prec: Precision) -> float:
    """Adam's update (PyTorch's reference implementation) works on two temporaries the size of the
    largest tensor, in the update's precision (:attr:`~.precision.Precision.update_bytes`)."""
    return 2 * largest_param_elems * max(prec.update_bytes, prec.param_bytes)


#: Megatron-LM's default gradient bucket, parameters: ``max(40M, 1M · dp)`` (its
#: ``DistributedDataParallelConfig.bucket_size``; larger groups get larger buckets).
MEGATRON_BUCKET_FLOOR_ELEMS = 40_000_000
MEGATRON_BUCKET_PER_RANK_ELEMS = 1_000_000


def data_parallel_collectives(runtime: Runtime, tp: int, dp: int, zero: int, tensors: Sequence[float],
                              grad_bytes: float, unit_share: float) -> float:
    """How many collectives of each data-parallel pass (gradient reduction, weight all-gather) an
    operator's parameter ``tensors`` (each one's local elements) account for, a fraction where they
    share one:

    - DeepSpeed ZeRO-3: buckets of :data:`~parplan.solver.cost.runtime.DEEPSPEED_BUCKET_ELEMENTS`
      (the size parplan's exports set for its prefetch and reduce buckets) that hold whole tensors.
      Its parameter coordinator gathers the tensors queued for the next sub-modules until the
      prefetch bucket is full and sends them as one coalesced all-gather; the reduction closes a
      bucket before a tensor that would overflow it. A tensor as large as a bucket thus travels in a
      collective of its own: each tensor counts ``min(1, elements / bucket)``;
    - another runtime that gathers each unit's weights (FSDP, torchtitan's replicate) sends one
      collective per unit: the operator's ``unit_share`` of its unit's parameters;
    - Megatron-LM: buckets of ``max(40M, 1M · dp)`` parameters;
    - DeepSpeed ZeRO 0-2: buckets of that size;
    - DDP: buckets of :data:`~parplan.solver.cost.collectives.DP_BUCKET_BYTES` of gradients.
    """
    if runtime is Runtime.DEEPSPEED and zero >= 3:
        return sum(min(1.0, t / DEEPSPEED_BUCKET_ELEMENTS) for t in tensors)
    local_elems = sum(tensors)
    if runtime.data_parallel(tp, dp, zero).gathers:
        return unit_share
    if runtime is Runtime.MEGATRON:
        return local_elems / max(MEGATRON_BUCKET_FLOOR_ELEMS, MEGATRON_BUCKET_PER_RANK_ELEMS * dp)
    if runtime is Runtime.DEEPSPEED:
        return local_elems / DEEPSPEED_BUCKET_ELEMENTS
    return local_elems * grad_bytes / DP_BUCKET_BYTES


def unit_parameter_numel(graph: Graph) -> dict[str, float]:
    """Elements of the distinct parameters each unit's operators read (whole tensors), by layer tag."""
    out: dict[str, float] = {}
    seen: set[tuple[str, str]] = set()
    for n in graph.nodes:
        unit = n.layer or ""
        for i in n.inputs:
            p = graph.node(i)
            if p.is_parameter and (unit, p.id) not in seen:
                seen.add((unit, p.id))
                out[unit] = out.get(unit, 0.0) + p.numel
    return out

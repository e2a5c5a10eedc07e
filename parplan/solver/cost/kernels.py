"""Kernel efficiency from the shapes: the fraction of a GPU's dense peak one matmul or attention reaches.

**Matmuls.** A tiled GEMM kernel (cuBLAS, CUTLASS) computes ``C[M, N] = A[M, K] · B[K, N]`` (``batch``
independent copies) in output tiles of :data:`TILE_LONG` × :data:`TILE_SHORT`; each streaming
multiprocessor (SM) works on one tile at a time, so the GEMM runs in ``ceil(tiles / SMs)`` waves.
Its efficiency is::

    ceiling × tile quantisation × wave quantisation × K fill

- tile quantisation ``M·N / (M'·N')``, with ``M'``, ``N'`` rounded up to whole tiles: a partial
  edge tile costs a whole one;
- wave quantisation ``tiles / (waves · SMs)``: the last wave leaves SMs idle;
- K fill ``K / (K + K_FILL)``: each tile's prologue (first loads) and epilogue (the write of C) cost
  about :data:`K_FILL` steps of the K loop;
- the ceiling: the fraction of the dense peak the generation's matmuls reach at shapes that fill
  every SM (:data:`KERNELS`, with where each figure comes from). A calibration measured on the
  hardware (the agent's matmul benchmark, on one large square matmul) replaces it.

Which dims are M, N, K and batch follows from the einsum: dims of both operands and the output are
the batch, of both operands only the contraction ``K``, of one operand and the output ``M`` (the
larger side) or ``N``. Sizes are one device's: each dim divided by how much the strategy cuts it.

**Attention.** A fused (flash) attention kernel reaches its own fraction of the peak, which depends
on the kernel the runtime calls (:data:`KERNELS`' ``attention``: Transformer Engine's fused
attention for Megatron-LM, PyTorch's ``scaled_dot_product_attention`` FlashAttention-2 path for the
PyTorch runtimes), on the pass, and where it was measured on the shape (:class:`AttentionCurve`)::

    ceiling(pass, head dim) × L / (L + fill(pass))

with ``L`` the keys one query loops over on a device (the local key length, or the window). Each
thread block of a flash kernel owns a block of queries and loops over the keys; its fixed work
(loading the queries, the softmax's last rescale, writing the output; backward also the dO·O
pass and the dQ atomics) and the masked half of the diagonal blocks cost about ``fill`` keys of
that loop. Efficiencies are in parplan's FLOP convention: the backward does twice the forward's
FLOPs (a flash backward really multiplies 2.5 times as much, since it recomputes QKᵀ; that extra
work is inside the backward's efficiency). Without flash attention the scores are materialised: QKᵀ
and PV are batched GEMMs (priced as above, over every query-key pair: an unfused kernel skips no
masked block) and the score matrix moves through HBM (:func:`unfused_score_bytes`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from parplan.solver.calibration import Calibration
from parplan.solver.cluster import GpuSpec, gpu_family
from parplan.solver.cost.runtime import Runtime
from parplan.solver.ir import Graph, Node, OpKind, attention_dims, parse_equation

#: Output tile of one SM (elements): 256 along the GEMM's longer free side, 128 along the shorter, a
#: large-problem tile of CUTLASS and cuBLAS on Ampere and Hopper. A side shorter than the tile takes
#: a tile of its own length rounded up to :data:`TILE_STEP` (the libraries' smaller tiles).
TILE_LONG = 256
TILE_SHORT = 128
TILE_STEP = 16
#: Prologue and epilogue of one tile, in steps of the K loop (elements of K). Of 64, 128, 256 and 512,
#: 256 fits the bf16 GEMMs of 300 µs or more measured on the lent H100 best: their efficiency over the
#: shape factor deviates 3.4 % from the median on average (4.0 % at 128, 4.8 % at 512).
K_FILL = 256


@dataclass(frozen=True)
class AttentionCurve:
    """One flash-attention kernel's fraction of the dense peak by pass and shape (module docstring):
    ``forward`` / ``backward`` ceilings by head dim (linear between the head dims listed, the
    nearest one's outside them), and the fixed work of one block of queries in keys of its loop,
    ``fill_forward`` / ``fill_backward`` (0: the ceiling whatever the length)."""

    forward: Mapping[int, float]
    backward: Mapping[int, float]
    fill_forward: float = 0.0
    fill_backward: float = 0.0

    def efficiency(self, backward: bool, head_dim: int, keys: int) -> float:
        """Fraction of the peak of one pass over ``keys`` keys per query at ``head_dim``."""
        ceilings, fill = (self.backward, self.fill_backward) if backward else (self.forward, self.fill_forward)
        dims = sorted(ceilings)
        d = min(max(head_dim, dims[0]), dims[-1])
        hi = next(x for x in dims if x >= d)
        lo = max(x for x in dims if x <= d)
        c = ceilings[lo] if hi == lo else ceilings[lo] + (ceilings[hi] - ceilings[lo]) * (d - lo) / (hi - lo)
        return c * keys / (keys + fill) if fill > 0 and keys > 0 else c

    @property
    def best(self) -> float:
        """The most any pass and shape reaches (a bound for time floors)."""
        return max(*self.forward.values(), *self.backward.values())


def flat_attention(efficiency: float) -> AttentionCurve:
    """A kernel known by one figure: both passes at ``efficiency`` whatever the shape."""
    return AttentionCurve(MappingProxyType({0: efficiency}), MappingProxyType({0: efficiency}))


@dataclass(frozen=True)
class KernelSpec:
    """Kernel figures of one GPU generation: SMs (compute units), GEMM ceilings by dtype, and the
    attention kernels' curves by kernel (``fused``: Transformer Engine / cuDNN; ``sdpa``:
    PyTorch's FlashAttention-2 path). A dtype or kernel not listed uses the calibration's
    matmul efficiency."""

    sms: int
    gemm: Mapping[str, float]
    attention: Mapping[str, AttentionCurve]
    #: thread blocks (CTAs) one NCCL ring collective's kernel runs, each holding an SM to itself
    #: while the collective runs (None: not known for this generation)
    collective_ctas: int | None = None
    #: by kernel library (:func:`memory_library`), the fraction of the HBM peak its operators of these
    #: kinds (``OpKind`` values) reach, where it was measured below a copy's (a kind or library not
    #: listed: the calibration's memory efficiency)
    memory: Mapping[str, Mapping[str, float]] = field(default_factory=lambda: MappingProxyType({}))
    #: whether its FP8 tensor cores take only K-major operands (Hopper, Ada), so that an FP8 GEMM's
    #: weight gradient needs a transposed FP8 copy of its activation and of its output gradient
    fp8_transposes: bool = False


def _spec(sms: int, gemm: dict[str, float], attention: dict[str, AttentionCurve],
          collective_ctas: int | None = None, memory: dict[str, dict[str, float]] | None = None,
          fp8_transposes: bool = False) -> KernelSpec:
    return KernelSpec(sms, MappingProxyType(gemm), MappingProxyType(attention), collective_ctas,
                      MappingProxyType({k: MappingProxyType(v) for k, v in (memory or {}).items()}), fp8_transposes)


#: PyTorch's scaled_dot_product_attention (FlashAttention-2 path) on an H100, bf16, causal, fitted
#: to the 8 calls measured on a lent H100 (bench/out/gpu-2026-11-23/kernels.json:
#: head dims 64 and 128, 1,024 to 8,192 tokens; bench/kernel_model_accuracy.py) for the least
#: largest error at two decimals and fills in steps of 50 tokens: every forward within 2.4 %, every
#: backward within 4.3 % of its measured time. Non-causal attention (no masked half blocks) is
#: faster than this curve says; not measured.
H100_SDPA = AttentionCurve(MappingProxyType({64: 0.49, 128: 0.67}), MappingProxyType({64: 0.37, 128: 0.44}),
                           fill_forward=600.0, fill_backward=1500.0)


#: Transformer Engine's fused attention on Hopper (cuDNN's flash kernels), bf16, causal, from the cuDNN
#: 9.1.1 figures Shah et al. publish (FlashAttention-3, 2024: an H100 SXM5 at 1,830 MHz, the clock of
#: the 989 TFLOP/s peak; head dims 64 and 128, 512 to 16,384 tokens). Forward: their causal figures
#: (Fig. 5 (b), (d)). Backward: only without a causal mask is published (Fig. 6); it is taken at that
#: figure times the forward's causal / non-causal ratio at the same head dim and length (0.63-0.94:
#: the masked diagonal blocks and the shorter rows), an estimate. Their backward counts 2.5 forwards,
#: parplan's 2. Fitted as :data:`H100_SDPA` was (least largest error at two decimals, fills in steps
#: of 50 tokens): each of the 24 pass-shapes within 4.6 %. H200: the same chip, not measured.
H100_CUDNN = AttentionCurve(MappingProxyType({64: 0.39, 128: 0.55}), MappingProxyType({64: 0.36, 128: 0.40}),
                            fill_forward=350.0, fill_backward=750.0)


#: Dtypes the tensor cores run: the tile model applies to them. fp32 runs on the CUDA cores, whose
#: kernels use smaller tiles (on the lent H100 an fp32 GEMM of 2048 × 1024 × 1024 reached 0.58 of
#: its peak, where the tile model allows 0.39): its matmuls take the ceiling alone.
TENSOR_CORE_DTYPES = frozenset({"bf16", "fp16", "fp8", "tf32"})
#: Dtypes the flash-attention kernels run (others: the calibration's matmul efficiency).
ATTENTION_DTYPES = frozenset({"bf16", "fp16", "fp8"})

#: By GPU family (a preset's name up to its memory size). Where each figure comes from (the
#: measurements and fits in full: docs/notes/time-model.md and docs/notes/h100.md):
#:
#: - SMs: the vendors' datasheets (A100 108, H100/H200 SXM 132, V100 80, L4 58, RTX 4090 128, MI300X
#:   304 CUs); B200/GB200 148 (Chips and Cheese, "Nvidia's B200: Keeping the CUDA Juggernaut Rolling").
#: - H100 16-bit and tf32 GEMM 0.74: measured on a lent H100 (bench/out/gpu-2026-11-23/kernels.json),
#:   the median efficiency / :func:`shape_factor` of its GEMMs of 1 ms or more (shorter ones run above
#:   it before the clocks settle under the power limit). H200: the same chip and clocks, not measured.
#: - H100 fp32 GEMM 0.77 (CUDA cores: no tile model): the same H100, the median of its fp32 GEMMs of
#:   1 ms or more. H200: not measured, the H100's.
#: - H100/H200 FP8 0.66: *fitted*, not measured, to Megatron-Bridge's five FP8 H100 runs
#:   (bench/time_model_accuracy.py), the casts around each GEMM priced apart (:func:`fp8_cast_bytes`);
#:   replace it by a calibration.
#: - B200/GB200 16-bit 0.62 and FP8 0.61: *derived*, OpenXLA's B200 matmul table
#:   (bench/data/xla_b200_matmul.json) times :data:`XLA_TO_SUSTAINED`; the GEMM's alone (casts apart).
#:   tf32/fp32: none (XLA runs f32 dots on sm_100 as TF32), the calibration's.
#: - A100 16-bit 0.79 and MI300X 0.56: *derived*, S. Bekman's "Maximum Achievable Matmul FLOPS" table
#:   (ml-engineering) times :data:`MAMF_TO_SUSTAINED` (the table's figures are burst rates).
#: - Attention, H100/H200: ``sdpa`` :data:`H100_SDPA` (measured), ``fused`` :data:`H100_CUDNN` (cuDNN
#:   9.1.1's published figures; later releases run 1.02-1.28x faster on an H200,
#:   bench/data/cudnn_sdpa_published.json, so the curve errs on the slow, safe side of a schedule).
#: - Attention, B200/GB200: ``fused`` :data:`BLACKWELL_CUDNN` (NVIDIA's published cuDNN 9.18 figures on
#:   a GB200); ``sdpa``, memory-bound kernels and NCCL CTAs: not known, the calibration's.
#: - Attention, A100, both kernels and passes 0.60: FlashAttention-2 reaches 50-73 % of the A100's peak
#:   forward, less backward (Dao 2023); not measured here.
#: - V100, L4, RTX 4090: no measurement; the calibration's efficiencies (the tile model still applies).
#: - Memory-bound kernels, H100 (H200: the H100's), PyTorch's (``torch``): measured on the lent H100
#:   (bench/out/gpu-2026-11-23/kernels.json): layer_norm 0.58-0.61 and softmax 0.37-0.39 of the HBM peak,
#:   the lower of each rounded down; a copy, an add and GELU 0.80-0.91 (the calibration's 0.8 stands).
#:   Backward passes are priced at the forward's fraction; Megatron-LM's kernels: the calibration's.
#: - Collective CTAs 24, A100 and H100/H200: a CTA of NCCL holds its SM (NVIDIA/nccl issue #1656);
#:   traces show 24 on a DGX A100 (NVIDIA/nccl issue #1225) and under FSDP on an H100 (NVIDIA developer
#:   forum, "Compute-Communication Overlap Causes Severe GEMM Performance Degradation because of Tail
#:   Effect"). Not measured here. Other GPUs: unknown, no slowdown priced.
_H100_TORCH_MEMORY = {"torch": {"layernorm": 0.58, "softmax": 0.36}}
#: The H100's 16-bit GEMM ceiling, measured on the lent H100 (above).
_H100_GEMM = 0.74
#: The H100's FP8 GEMM ceiling, *fitted* (above): the two-decimal value with the least largest
#: |log(predicted / published)| over Megatron-Bridge's five H100 FP8 runs, their casts priced apart.
_H100_FP8 = 0.66
#: The lent H100's sustained bf16 GEMM ceiling over the one XLA's H100 table implies (0.74 / 0.873):
#: how much of XLA's profiled rate a GEMM keeps in training (B200 figures below).
XLA_TO_SUSTAINED = _H100_GEMM / 0.873
#: The lent H100's sustained bf16 GEMM ceiling over the same GPU's entry in Bekman's matmul table,
#: 792.1 of 989 TFLOP/s (CUDA 12.1): how much of that table's burst rate a GEMM keeps in training.
MAMF_TO_SUSTAINED = _H100_GEMM / (792.1 / 989)

_B200_XLA_CEILINGS = {"bf16": 0.733, "fp16": 0.733, "fp8": 0.718}  # bench/kernel_model_accuracy.py


def _sustained(burst: Mapping[str, float], ratio: float) -> dict[str, float]:
    """GEMM ceilings by dtype from a published table's burst ones: each times ``ratio`` (the share of
    that table's H100 figure the lent H100 sustained), at two decimals."""
    return {k: round(v * ratio, 2) for k, v in burst.items()}


def _sixteen_bit(fraction: float) -> dict[str, float]:
    """The same fraction for bf16 and fp16 (the same tensor-core rate)."""
    return {"bf16": fraction, "fp16": fraction}

_HOPPER = _spec(132, {"bf16": _H100_GEMM, "fp16": _H100_GEMM, "tf32": _H100_GEMM, "fp8": _H100_FP8, "fp32": 0.77},
                {"fused": H100_CUDNN, "sdpa": H100_SDPA}, 24, _H100_TORCH_MEMORY, fp8_transposes=True)
#: Transformer Engine's fused attention on Blackwell (cuDNN's flash kernels), bf16, causal, from NVIDIA's
#: published cuDNN 9.18 training benchmark on a GB200 (bench/data/cudnn_sdpa_published.json: head dim
#: 128, 64 query and 8 KV heads, 2,048 to 32,768 tokens, kernel time), as fractions of the GB200's
#: dense peak; the B200 is the same chip (sm_100) and takes the same fractions of its own. Their
#: backward counts 2.5 forwards, parplan's 2. Fitted as :data:`H100_CUDNN` was (least largest error,
#: two decimals, fills in steps of 50 tokens): each of the 10 pass-shapes within 2.7 %. Head dim 64
#: is not published: the curve's one head dim stands for every head dim.
BLACKWELL_CUDNN = AttentionCurve(MappingProxyType({128: 0.72}), MappingProxyType({128: 0.49}),
                                 fill_forward=1500.0, fill_backward=1700.0)
_B200 = _spec(148, _sustained(_B200_XLA_CEILINGS, XLA_TO_SUSTAINED),
              {"fused": BLACKWELL_CUDNN})
KERNELS: Mapping[str, KernelSpec] = MappingProxyType({
    # Bekman's burst fractions of the dense 16-bit peaks (A100 SXM, CUDA 12.1; MI300X, ROCm 6.2)
    "A100": _spec(108, _sustained(_sixteen_bit(267.9 / 312), MAMF_TO_SUSTAINED),
                  {"fused": flat_attention(0.60), "sdpa": flat_attention(0.60)}, 24),
    "H100": _HOPPER,
    "H200": _HOPPER,  # the same chip and clocks, not measured
    "B200": _B200,
    "GB200": _B200,  # the same chip (sm_100), run at 1,200 W: its peaks are higher, the fractions the same
    "MI300X": _spec(304, _sustained(_sixteen_bit(781.9 / 1300), MAMF_TO_SUSTAINED), {}),
    "V100": _spec(80, {}, {}),
    "L4": _spec(58, {}, {}, fp8_transposes=True),
    "RTX-4090": _spec(128, {}, {}, fp8_transposes=True),
})


def kernel_spec(gpu: GpuSpec) -> KernelSpec | None:
    """The :data:`KERNELS` entry of ``gpu``'s family (None for a GPU parplan has no figures for)."""
    return KERNELS.get(gpu_family(gpu.name))


def collective_sm_share(gpu: GpuSpec) -> float:
    """The share of ``gpu``'s SMs a data-parallel collective's kernel holds while it runs (its CTAs
    over the SMs, :data:`KERNELS`), which the compute it overlaps runs without; 0 where unknown.
    A lower bound of the slowdown: a GEMM whose tiles filled every SM in whole waves loses a wave's
    tail besides."""
    spec = kernel_spec(gpu)
    if spec is None or spec.collective_ctas is None:
        return 0.0
    return spec.collective_ctas / spec.sms


#: HBM bytes per element of casting a bf16 tensor to FP8 for a GEMM (Transformer Engine's and
#: torchao's delayed- or tensor-scaled cast: the bf16 read, the FP8 write, its amax taken on the way).
FP8_CAST_BYTES = 3


#: HBM bytes per element current scaling adds to a cast: the bf16 tensor read once more for its amax
#: before it is scaled (the scale must be known before the first element is cast).
FP8_AMAX_BYTES = 2


def fp8_cast_bytes(gpu: GpuSpec, current_scaling: bool = False) -> int:
    """HBM bytes per element an FP8 GEMM operand's cast moves on ``gpu``: :data:`FP8_CAST_BYTES`,
    one more where the weight gradient needs a transposed copy (:attr:`KernelSpec.fp8_transposes`:
    the cast writes both, as Transformer Engine's ``cast_transpose`` does), and
    :data:`FP8_AMAX_BYTES` more under ``current_scaling``."""
    spec = kernel_spec(gpu)
    return (FP8_CAST_BYTES + (1 if spec is not None and spec.fp8_transposes else 0)
            + (FP8_AMAX_BYTES if current_scaling else 0))


def memory_library(runtime: Runtime) -> str:
    """Whose memory-bound kernels a runtime runs: ``te`` (Megatron-LM: Transformer Engine's
    normalisations, Megatron's fused softmax) or ``torch`` (PyTorch's)."""
    return "te" if runtime is Runtime.MEGATRON else "torch"


def memory_efficiency(gpu: GpuSpec, kind: str, calibration: Calibration, library: str) -> float:
    """The fraction of ``gpu``'s HBM peak an operator of ``kind`` (an ``OpKind`` value) of
    ``library``'s kernels reaches: the calibration's memory efficiency, or the kind's measured figure
    (:data:`KERNELS`' ``memory``) where that is lower (a calibration measures a copy, which no
    normalisation reaches)."""
    spec = kernel_spec(gpu)
    figure = spec.memory.get(library, {}).get(kind) if spec is not None else None
    return calibration.memory_efficiency if figure is None else min(calibration.memory_efficiency, figure)


def attention_kernel(runtime: Runtime) -> str:
    """The flash-attention kernel a runtime calls: ``fused`` (Megatron-LM: Transformer Engine),
    else ``sdpa`` (PyTorch's scaled_dot_product_attention)."""
    return "fused" if runtime is Runtime.MEGATRON else "sdpa"


@dataclass(frozen=True)
class GemmShape:
    """One device's GEMM: ``batch`` independent ``M × K`` by ``K × N`` products."""

    batch: int
    m: int
    n: int
    k: int


def gemm_shape(node: Node, graph: Graph, cuts: Mapping[str, int]) -> GemmShape | None:
    """The GEMM of a two-operand einsum on one device, each dim divided by ``cuts[dim]`` (rounded
    up); None for any other operator. M is the larger of the two free sides."""
    sides = _gemm_sides(node, graph, cuts)
    if sides is None:
        return None
    batch, rows, cols, k = sides
    return GemmShape(batch, max(rows, cols), min(rows, cols), k)


def _gemm_sides(node: Node, graph: Graph, cuts: Mapping[str, int]) -> tuple[int, int, int, int] | None:
    """(batch, rows of the first operand, columns of the second, contraction) of a two-operand
    einsum on one device (:func:`gemm_shape` before it orders the free sides)."""
    eq = node.attrs.get("equation")
    if node.kind is not OpKind.EINSUM or len(node.inputs) != 2 or not isinstance(eq, str):
        return None
    operands, out = parse_equation(eq)
    sizes: dict[str, int] = {}
    for t in (*(graph.node(i) for i in node.inputs), node):
        sizes.update(t.dims)
    a, b, o = set(operands[0]), set(operands[1]), set(out)

    def size(dims: set[str]) -> int:
        return math.prod(-(-sizes[d] // cuts.get(d, 1)) for d in dims if d in sizes)

    return size(a & b & o), size((a & o) - b), size((b & o) - a), size((a & b) - o)


def gemm_group(node: Node, graph: Graph) -> tuple[Node, ...]:
    """The einsums that read ``node``'s input and share its ``gemm_group`` name (itself included;
    itself alone without one): the projections of one input a trainer may run as one GEMM, the
    weights side by side."""
    name = node.attrs.get("gemm_group")
    if not isinstance(name, str) or not node.inputs:
        return (node,)
    groups = graph.memo.get("gemm_groups")
    if groups is None:
        found: dict[tuple[str, str], list[Node]] = {}
        for n in graph.nodes:
            g = n.attrs.get("gemm_group")
            if isinstance(g, str) and n.inputs:
                found.setdefault((n.inputs[0], g), []).append(n)
        groups = graph.memo["gemm_groups"] = {key: tuple(ns) for key, ns in found.items()}
    members = groups.get((node.inputs[0], name), ())
    return members if any(m is node for m in members) else (node,)


def grouped_gemm_shape(node: Node, graph: Graph, cuts: Mapping[str, int]) -> GemmShape | None:
    """The one GEMM ``node``'s group (:func:`gemm_group`) runs as: the members' common input by
    their weights side by side, each cut as ``cuts`` cuts ``node`` (None for an operator that is no
    GEMM; ``node``'s own shape where the members' batch, rows or contraction differ)."""
    members = gemm_group(node, graph)
    sides = [_gemm_sides(m, graph, cuts) for m in members]
    first = sides[0] if sides else None
    if first is None or any(s is None or s[0] != first[0] or s[1] != first[1] or s[3] != first[3] for s in sides):
        return gemm_shape(node, graph, cuts)
    batch, rows, _, k = first
    cols = sum(s[2] for s in sides if s is not None)
    return GemmShape(batch, max(rows, cols), min(rows, cols), k)


def shape_factor(shape: GemmShape, sms: int, fill: bool = True) -> float:
    """Tile quantisation × wave quantisation × K fill (``fill``) of ``shape`` on ``sms`` SMs (module
    docstring)."""
    if min(shape.batch, shape.m, shape.n, shape.k) <= 0:
        return 1.0
    side_m = min(TILE_LONG, -(-shape.m // TILE_STEP) * TILE_STEP)
    side_n = min(TILE_SHORT, -(-shape.n // TILE_STEP) * TILE_STEP)
    tm, tn = -(-shape.m // side_m), -(-shape.n // side_n)
    tiles = shape.batch * tm * tn
    waves = -(-tiles // sms)
    tile_q = shape.m * shape.n / (tm * side_m * tn * side_n)
    wave_q = tiles / (waves * sms)
    return tile_q * wave_q * (shape.k / (shape.k + K_FILL) if fill else 1.0)


def gemm_ceiling(gpu: GpuSpec, dtype: str, calibration: Calibration) -> float:
    """The ceiling of ``gpu``'s ``dtype`` matmuls: the calibration's matmul efficiency when it was
    measured on the hardware or the GPU has no figure for the dtype, else :data:`KERNELS`'."""
    spec = kernel_spec(gpu)
    if calibration.measured or spec is None or dtype not in spec.gemm:
        return calibration.matmul_efficiency_for(dtype)
    return spec.gemm[dtype]


def gemm_efficiency(shape: GemmShape, gpu: GpuSpec, ceiling: float, dtype: str, fill: bool = True) -> float:
    """Fraction of the dense peak a ``dtype`` GEMM of ``shape`` reaches: ``ceiling`` ×
    :func:`shape_factor` (the ceiling alone on a GPU without an SM count, or for a dtype the tensor
    cores do not run). ``fill=False`` leaves the K fill out, for a GEMM whose output writes are
    priced as traffic of their own (an unfused attention's scores)."""
    spec = kernel_spec(gpu)
    if spec is None or dtype not in TENSOR_CORE_DTYPES:
        return ceiling
    return ceiling * shape_factor(shape, spec.sms, fill)


def attention_curve(gpu: GpuSpec, kernel: str, dtype: str) -> AttentionCurve | None:
    """``kernel``'s (``fused`` / ``sdpa``) curve on ``gpu`` in ``dtype``; None where :data:`KERNELS`
    has none or the dtype is not one the flash kernels run (the calibration's matmul efficiency
    then stands for both passes)."""
    spec = kernel_spec(gpu)
    if spec is None or dtype not in ATTENTION_DTYPES:
        return None
    return spec.attention.get(kernel)


def attention_efficiency(gpu: GpuSpec, kernel: str, dtype: str, calibrated: float, *, backward: bool = False,
                         head_dim: int = 128, keys: int = 0) -> float:
    """Fraction of the dense peak ``kernel`` reaches on ``gpu`` in ``dtype`` in one pass
    (``backward``) over ``keys`` keys per query at ``head_dim`` (:class:`AttentionCurve`;
    ``calibrated`` where there is no curve, :func:`attention_curve`)."""
    curve = attention_curve(gpu, kernel, dtype)
    return calibrated if curve is None else curve.efficiency(backward, head_dim, keys)


def flash_attention_shape(node: Node, graph: Graph, cuts: Mapping[str, int]) -> tuple[int, int]:
    """(head dim, keys one query loops over) of one device's share of a flash attention: the key
    length divided by its cut, no more than the window of a sliding-window attention."""
    q, k = graph.node(node.inputs[0]), graph.node(node.inputs[1])
    head_dim, kv_seq = attention_dims(node, q, k)
    keys = -(-dict(k.dims)[kv_seq] // cuts.get(kv_seq, 1))
    window = node.attrs.get("window")
    if isinstance(window, int) and 0 < window < keys:
        keys = window
    return dict(q.dims)[head_dim], keys


def unfused_attention_gemms(node: Node, graph: Graph, cuts: Mapping[str, int]) -> tuple[GemmShape, GemmShape]:
    """One device's QKᵀ and PV of an attention without a fused kernel, over every query-key pair:
    ``batch`` = q's dims other than the head dim and the query length (batch and heads). The query
    length is the key length's dim in self-attention, else q's dim named ``seq``."""
    q, k = graph.node(node.inputs[0]), graph.node(node.inputs[1])
    head_dim, kv_seq = attention_dims(node, q, k)
    qd = dict(q.dims)
    q_seq = kv_seq if kv_seq in qd else next((d for d in qd if "seq" in d and d != head_dim), None)

    def local(name: str, size: int) -> int:
        return -(-size // cuts.get(name, 1))

    sq = local(q_seq, qd[q_seq]) if q_seq is not None else 1
    kv = local(kv_seq, dict(k.dims)[kv_seq])
    hd = local(head_dim, qd[head_dim])
    v_dim = local(head_dim, dict(node.dims).get(head_dim, qd[head_dim]))  # the values' (output's) width
    batch = math.prod(local(d, s) for d, s in qd.items() if d not in (head_dim, q_seq))
    return GemmShape(batch, max(sq, kv), min(sq, kv), hd), GemmShape(batch, max(sq, v_dim), min(sq, v_dim), kv)


def unfused_scores(node: Node, graph: Graph, work: int) -> float:
    """Elements of one device's share of an unfused attention's score matrix (every query-key pair
    of every head; ``work``: the devices its work is split over)."""
    q, k = graph.node(node.inputs[0]), graph.node(node.inputs[1])
    head_dim, kv_seq = attention_dims(node, q, k)
    return q.numel / dict(q.dims)[head_dim] * dict(k.dims)[kv_seq] / work


def unfused_score_bytes(node: Node, graph: Graph, work: int, activation_bytes: int) -> float:
    """Forward HBM traffic of the score matrix of one device's share of an unfused attention: QKᵀ
    writes it, the softmax reads it and writes the probabilities, PV reads them (4 passes); attention
    dropout (``attrs.dropout`` > 0) reads and writes them once more and writes a one-byte mask. Of
    these, QKᵀ's write and PV's read are the GEMMs' own (:data:`GEMM_SCORE_PASSES`)."""
    dropout = float(node.attrs.get("dropout") or 0.0) > 0
    return unfused_scores(node, graph, work) * ((6 if dropout else 4) * activation_bytes + (1 if dropout else 0))


#: Passes over the score matrix that the unfused attention's GEMMs make themselves (QKᵀ writes it,
#: PV reads the probabilities): they move while the GEMMs compute.
GEMM_SCORE_PASSES = 2
#: The softmax's passes over it (it reads the scores and writes the probabilities).
SOFTMAX_SCORE_PASSES = 2


def efficiency_bound(node: Node, graph: Graph, gpu: GpuSpec, calibration: Calibration, dtype: str,
                     runtime: Runtime) -> float:
    """The most of the ``dtype`` peak ``node``'s kernel reaches however the operator is split (a
    bound for time floors): a GEMM its ceiling times the K fill of its whole contraction (a split
    K only shortens it; tiles and waves only lose), flash attention the best of its kernel's curve
    (either pass, any length), anything else the calibration's matmul efficiency (as
    :func:`~parplan.solver.cost.rules.op_seconds`)."""
    calibrated = calibration.matmul_efficiency_for(dtype)
    shape = gemm_shape(node, graph, {})
    if shape is not None:
        ceiling = gemm_ceiling(gpu, dtype, calibration)
        if kernel_spec(gpu) is None or dtype not in TENSOR_CORE_DTYPES or shape.k <= 0:
            return ceiling
        return ceiling * shape.k / (shape.k + K_FILL)
    if node.kind is OpKind.ATTENTION:
        curve = attention_curve(gpu, attention_kernel(runtime), dtype)
        return calibrated if curve is None else curve.best
    return calibrated

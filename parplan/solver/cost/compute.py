"""Compute cost of one operator: FLOPs, memory traffic, and a roofline time on one GPU.

FLOPs count a multiply-add as 2. Counts are for the whole (unsharded) operator; a strategy that
splits it over ``k`` devices divides them by ``k``. Rules per kind (``numel`` = elements):

- ``einsum`` with ≥ 2 operands: ``2 · Π sizes of all distinct dim names`` in the equation (a
  matmul ``m k, k n -> m n`` gives ``2mkn``). One operand: ``numel(input)`` when it reduces
  (output smaller than input), else 0 (a transpose).
- ``attention``: ``4 · batch · heads · seq · kv_seq · head_dim`` (QKᵀ and PV), i.e.
  ``2 · numel(q) · kv_seq + 2 · numel(output) · kv_seq`` (the two differ when values are narrower,
  as in multi-head latent attention); halved when ``attrs.causal``. A 4th input (a bias on the
  scores) adds ``numel(q) / head_dim · kv_seq``; attention sinks (``attrs.sinks``, one logit per
  head) add nothing worth counting. A causal sliding window of ``w < kv_seq`` keys
  (``attrs.window``; query i sees keys i − w + 1 .. i) computes ``w(w+1)/2 + (s − w)·w`` pairs
  of the s = kv_seq queries, priced like the causal rule's ``s²/2`` (its pairs less half the
  diagonal) as that count less s/2: a windowed flash kernel skips the blocks outside the window;
  the tensors saved for backward do not change. See :func:`attention_dims` for how the dims are found.
- ``elementwise``: per output element, ``max(inputs − 1, 1)`` for add/sub/mul, 1 for scale and
  relu, 8 for gelu and silu, 4 for tanh, sigmoid and exp (plus ``inputs − 1`` extra operands).
- ``softmax`` 5, ``layernorm`` 8, ``rmsnorm`` 5, ``dropout`` 2 per element; ``cross_entropy``
  5 per logit; ``dispatch`` / ``combine`` 2 per output element; ``reduce`` 1 per input element;
  ``input``, ``parameter``, ``embedding`` (a gather), ``reshape``, ``concat`` 0.

Backward costs 2× the forward FLOPs (a gradient for the input and one for the weight, or the
equivalent work for ops without weights) — the usual estimate, also for recomputation
accounting (recomputation adds one more forward).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from parplan.solver.calibration import DEFAULT_CALIBRATION, Calibration
from parplan.solver.cluster import GpuSpec
from parplan.solver.errors import ConfigError
from parplan.solver.ir import DTYPE_BYTES, Graph, Node, OpKind, attention_dims, parse_equation

#: FLOPs per output element of unary-style elementwise functions (add/sub/mul are counted apart).
ELEMENTWISE_FLOPS_PER_ELEMENT: Mapping[str, int] = {
    "scale": 1, "relu": 1, "gelu": 8, "silu": 8, "tanh": 4, "sigmoid": 4, "exp": 4,
}

#: FLOPs per element of the ops whose cost is linear in their output.
_PER_ELEMENT: Mapping[OpKind, int] = {
    OpKind.SOFTMAX: 5, OpKind.LAYERNORM: 8, OpKind.RMSNORM: 5, OpKind.DROPOUT: 2,
    OpKind.DISPATCH: 2, OpKind.COMBINE: 2,
}

_ZERO: frozenset[OpKind] = frozenset(
    {OpKind.INPUT, OpKind.PARAMETER, OpKind.EMBEDDING, OpKind.RESHAPE, OpKind.CONCAT})


def _inputs(node: Node, graph: Graph) -> list[Node]:
    try:
        return [graph.node(i) for i in node.inputs]
    except KeyError as e:
        raise ConfigError(f"node {node.id!r} reads unknown node {e.args[0]!r}") from None


def _einsum_flops(node: Node, ins: list[Node]) -> float:
    eq = node.attrs.get("equation")
    if not isinstance(eq, str):
        raise ConfigError(f"einsum node {node.id!r} has no attrs.equation")
    operands, out = parse_equation(eq)
    sizes: dict[str, int] = {}
    for n in (*ins, node):
        sizes.update(n.dims)
    names = dict.fromkeys(name for op in operands for name in op)
    names.update(dict.fromkeys(out))
    missing = [d for d in names if d not in sizes]
    if missing:
        raise ConfigError(f"einsum node {node.id!r}: dims {missing} of its equation are on no tensor")
    if len(ins) == 1:
        return float(ins[0].numel) if node.numel < ins[0].numel else 0.0
    return 2.0 * math.prod(sizes[d] for d in names)


def _attention_flops(node: Node, ins: list[Node]) -> float:
    if len(ins) < 3:
        raise ConfigError(f"attention node {node.id!r} needs q, k, v inputs")
    q, k = ins[0], ins[1]
    head_dim, kv_seq = attention_dims(node, q, k)
    kv = dict(k.dims)[kv_seq]
    flops = 2.0 * q.numel * kv + 2.0 * node.numel * kv
    if len(ins) > 3 and not node.attrs.get("sinks"):
        flops += q.numel / dict(q.dims).get(head_dim, 1) * kv
    window = int(node.attrs.get("window") or 0)
    if 0 < window < kv:
        pairs = window * (window + 1) / 2 + (kv - window) * window - kv / 2 if node.attrs.get("causal") \
            else kv * window  # (a bidirectional window: about ``window`` keys per query)
        return flops * pairs / (kv * kv)
    return flops / 2 if node.attrs.get("causal") else flops


def _elementwise_flops(node: Node, ins: list[Node]) -> float:
    fn = node.attrs.get("fn")
    extra = max(len(ins) - 1, 0)
    if fn in ELEMENTWISE_FLOPS_PER_ELEMENT:
        per = ELEMENTWISE_FLOPS_PER_ELEMENT[str(fn)] + extra
    else:  # add, sub, mul, and anything unknown: one op per extra operand
        per = max(extra, 1)
    return float(per * node.numel)


def forward_flops(node: Node, graph: Graph) -> float:
    """FLOPs of ``node``'s forward pass (whole tensor, unsharded); rules in the module docstring."""
    kind = node.kind
    if kind in _ZERO:
        return 0.0
    ins = _inputs(node, graph)
    if kind is OpKind.EINSUM:
        return _einsum_flops(node, ins)
    if kind is OpKind.ATTENTION:
        return _attention_flops(node, ins)
    if kind is OpKind.ELEMENTWISE:
        return _elementwise_flops(node, ins)
    if kind in _PER_ELEMENT:
        return float(_PER_ELEMENT[kind] * node.numel)
    if kind is OpKind.CROSS_ENTROPY:
        return 5.0 * ins[0].numel
    if kind is OpKind.REDUCE:
        return float(ins[0].numel)
    raise ConfigError(f"no FLOP rule for op kind {kind!r} (node {node.id!r})")  # pragma: no cover


def backward_flops(node: Node, graph: Graph) -> float:
    """FLOPs of ``node``'s backward pass: 2 × :func:`forward_flops` (input and weight gradients)."""
    return 2.0 * forward_flops(node, graph)


def bytes_moved(node: Node, graph: Graph, activation_bytes: int | None = 2,
                input_shards: Sequence[float] | None = None, output_shards: float = 1.0) -> float:
    """Bytes of memory traffic of ``node``'s forward pass: read each distinct input, write the output.

    Every tensor counts ``activation_bytes`` per element, or its own dtype's size when None.
    ``input``, ``parameter`` and ``reshape`` (a view) move nothing; ``embedding`` reads the ids and
    only the gathered table rows (as many elements as its output). ``attention`` counts q, k, v
    and the output only (a fused kernel: the score matrix is never written to HBM). On a device
    that holds ``1 / input_shards[i]`` of input ``i`` and ``1 / output_shards`` of the output,
    the traffic is of those pieces.
    """
    if node.kind in (OpKind.INPUT, OpKind.PARAMETER, OpKind.RESHAPE):
        return 0.0

    def size(n: Node) -> int:
        return activation_bytes if activation_bytes is not None else DTYPE_BYTES.get(n.dtype, 2)

    ins = _inputs(node, graph)
    shards = list(input_shards) if input_shards is not None else [1.0] * len(ins)
    out = node.numel * size(node) / output_shards
    if node.kind is OpKind.EMBEDDING:
        return float(ins[0].numel * size(ins[0]) / shards[0] + node.numel * size(ins[1]) / output_shards + out)
    seen: dict[str, float] = {}
    for n, k in zip(ins, shards, strict=True):
        seen.setdefault(n.id, n.numel * size(n) / k)
    return float(sum(seen.values()) + out)


def math_peak(gpu: GpuSpec, dtype: str) -> float:
    """Dense peak FLOP/s of ``dtype`` math on ``gpu``: a GPU without tf32 math (V100) runs tf32 at
    its fp32 peak; other missing dtypes raise ConfigError."""
    return gpu.peak("fp32" if dtype == "tf32" and "tf32" not in gpu.peak_flops else dtype)


def op_seconds(flops: float, traffic_bytes: float, gpu: GpuSpec, dtype: str = "bf16",
               matmul_efficiency: float | None = None, memory_efficiency: float | None = None) -> float:
    """Roofline time in seconds: ``max(flops / (peak[dtype]·matmul_eff), bytes / (hbm·memory_eff))``.

    Efficiencies default to :data:`~parplan.solver.calibration.DEFAULT_CALIBRATION`'s; the peak is
    :func:`math_peak`'s.
    """
    if flops < 0 or traffic_bytes < 0:
        raise ConfigError(f"op_seconds needs flops and bytes >= 0, got {flops}, {traffic_bytes}")
    m_eff = (matmul_efficiency if matmul_efficiency is not None
             else DEFAULT_CALIBRATION.matmul_efficiency_for(dtype))
    b_eff = memory_efficiency if memory_efficiency is not None else DEFAULT_CALIBRATION.memory_efficiency
    if not (0 < m_eff <= 1 and 0 < b_eff <= 1):
        raise ConfigError(f"efficiencies must be in (0, 1], got {m_eff}, {b_eff}")
    compute = flops / (math_peak(gpu, dtype) * m_eff) if flops > 0 else 0.0
    memory = traffic_bytes / (gpu.hbm_bandwidth_bytes_per_s * b_eff)
    return max(compute, memory)


def forward_seconds(node: Node, graph: Graph, gpu: GpuSpec, calibration: Calibration = DEFAULT_CALIBRATION,
                    activation_bytes: int | None = 2, dtype: str | None = None) -> float:
    """Roofline time of ``node``'s forward pass on one GPU (whole operator, unsharded).

    ``dtype`` is the math dtype (default: the node's). Non-float nodes have no FLOPs to price.
    """
    math_dtype = dtype or node.dtype
    return op_seconds(forward_flops(node, graph), bytes_moved(node, graph, activation_bytes), gpu, math_dtype,
                      calibration.matmul_efficiency_for(math_dtype), calibration.memory_efficiency)


def backward_seconds(node: Node, graph: Graph, gpu: GpuSpec, calibration: Calibration = DEFAULT_CALIBRATION,
                     activation_bytes: int | None = 2, dtype: str | None = None) -> float:
    """Roofline time of ``node``'s backward pass: 2× the forward FLOPs and 2× the forward traffic
    (read the output gradient and the saved inputs, write the input gradients)."""
    math_dtype = dtype or node.dtype
    return op_seconds(backward_flops(node, graph), 2 * bytes_moved(node, graph, activation_bytes), gpu,
                      math_dtype, calibration.matmul_efficiency_for(math_dtype),
                      calibration.memory_efficiency)

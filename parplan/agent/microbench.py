"""Micro-benchmarks the agent posts as a hardware profile: matmul throughput per dtype and the
bandwidth of all-reduce and all-gather per group size, plus the calibration they imply.

Bandwidths are *bus* bandwidths in the cost model's own terms, so that the model's formulas give
back the measured times: an all-reduce of S bytes over n ranks taking t seconds has bandwidth
``2(n-1)/n · S / t``; an all-gather producing S bytes, ``(n-1)/n · S / t``.
"""

from __future__ import annotations

import datetime as _dt
import os
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from parplan.solver.calibration import Calibration
from parplan.solver.cluster import GPU_PRESETS, GpuSpec, Link
from parplan.solver.cost.kernels import GemmShape, gemm_efficiency

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
#: The square matmul timed on a GPU (n x n by n x n).
CUDA_MATMUL_N = 4096


def matmul_flops_per_s(device: torch.device, n: int | None = None, repeats: int = 5) -> dict[str, float]:
    """Achieved FLOP/s of an n x n matmul per dtype (median of ``repeats``)."""
    size = n or (CUDA_MATMUL_N if device.type == "cuda" else 512)
    out: dict[str, float] = {}
    for name, dtype in _DTYPES.items():
        try:
            a = torch.randn(size, size, device=device, dtype=dtype)
            b = torch.randn(size, size, device=device, dtype=dtype)
        except (RuntimeError, TypeError):
            continue
        torch.matmul(a, b)  # warm-up
        times = []
        for _ in range(repeats):
            _sync(device)
            t0 = time.perf_counter()
            torch.matmul(a, b)
            _sync(device)
            times.append(time.perf_counter() - t0)
        out[name] = 2 * size**3 / max(statistics.median(times), 1e-9)
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_seconds(fn: Callable[[], Any], repeats: int, group: Any, device: torch.device) -> float:
    import torch.distributed as dist

    fn()
    times = []
    for _ in range(repeats):
        dist.barrier(group=group)
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return max(statistics.median(times), 1e-9)


def collective_worker(nbytes: int, repeats: int) -> dict[str, dict[str, float]]:
    """Entry point of one rank (process group initialised by the launcher): bus bandwidth of
    all-reduce and all-gather for every power-of-two group size up to the world size."""
    import torch.distributed as dist

    world = dist.get_world_size()
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if dist.get_backend() == "nccl" \
        else torch.device("cpu")
    results: dict[str, dict[str, float]] = {"all_reduce": {}, "all_gather": {}, "latency": {}}
    n = 2
    while n <= world:
        group = dist.new_group(list(range(n)))
        if rank < n:
            elems = max(n, nbytes // 4 // n * n)
            x = torch.ones(elems, device=device)
            out = torch.empty(elems, device=device)
            shard = torch.ones(elems // n, device=device)
            tiny = torch.ones(1, device=device)
            ops = {"all_reduce": partial(dist.all_reduce, x, group=group),
                   "all_gather": partial(dist.all_gather_into_tensor, out, shard, group=group),
                   "latency": partial(dist.all_reduce, tiny, group=group)}
            for what, fn in ops.items():
                t = _median_seconds(fn, repeats, group, device)
                size = elems * 4
                if what == "all_reduce":
                    results[what][str(n)] = 2 * (n - 1) / n * size / t
                elif what == "all_gather":
                    results[what][str(n)] = (n - 1) / n * size / t
                else:
                    results[what][str(n)] = t
        dist.barrier()
        n *= 2
    return results


def _gpu_spec_for(device_name: str) -> Any:
    key = device_name.upper().replace(" ", "")
    for name, spec in GPU_PRESETS.items():
        family = name.split("-")[0].upper()
        if family and family in key:
            return spec
    return None


def matmul_ceilings(flops: dict[str, float], spec: GpuSpec, n: int) -> dict[str, float]:
    """The calibration's matmul efficiencies from ``flops`` (achieved FLOP/s of an ``n``-cubed matmul
    per dtype): the ceilings the time model multiplies by each GEMM's shape factor, so the measured
    fraction of the peak is divided by the timed matmul's own (:mod:`parplan.solver.cost.kernels`),
    and the model gives back the measured time for that matmul."""
    out: dict[str, float] = {}
    for dtype, achieved in flops.items():
        peak = spec.peak_flops.get(dtype)
        if peak:
            eff = gemm_efficiency(GemmShape(1, n, n, n), spec, 1.0, dtype)
            out[dtype] = min(1.0, achieved / (peak * eff))
    return out


def profile(hardware: dict[str, Any], device: torch.device, max_procs: int,
            nbytes: int = 8 * 2**20, repeats: int = 5) -> dict[str, Any]:
    """The ``data`` of a ``POST /v1/profiles`` body: matmul throughput, collective bandwidths per
    group size and the :class:`Calibration` they imply."""
    from parplan.agent.launch import launch_function

    flops = matmul_flops_per_s(device)
    procs = 1
    while procs * 2 <= max_procs:
        procs *= 2
    coll: dict[str, dict[str, float]] = {"all_reduce": {}, "all_gather": {}, "latency": {}}
    if procs >= 2:
        per_rank = launch_function(collective_worker, (nbytes, repeats), procs, device.type)
        coll = per_rank[0]
    spec = _gpu_spec_for(hardware.get("device_name", "")) if device.type == "cuda" else None
    efficiency = matmul_ceilings(flops, spec, CUDA_MATMUL_N) if spec is not None else {}
    link = None
    if coll["all_reduce"]:
        largest = max(coll["all_reduce"], key=int)
        link = Link(bandwidth_bytes_per_s=coll["all_reduce"][largest],
                    latency_seconds=coll["latency"].get(largest, 0.0) / max(1, 2 * (int(largest) - 1)))
    stamp = _dt.date.today().isoformat()
    calib = Calibration(matmul_efficiency=efficiency or Calibration().matmul_efficiency, intra_node=link,
                        source=f"agent:{hardware.get('key', 'unknown')}@{stamp}")
    return {"matmul_flops_per_s": flops, "all_reduce_bytes_per_s": coll["all_reduce"],
            "all_gather_bytes_per_s": coll["all_gather"], "all_reduce_latency_seconds": coll["latency"],
            "calibration": calib.to_dict(),
            "notes": ("matmul efficiencies are measured / (datasheet peak of the matching GPU preset x the timed "
                      "matmul's shape factor): ceilings, as parplan.solver.cost.kernels uses them"
                      if efficiency else "no datasheet peak for this device: default matmul efficiencies")}

"""Optimizer offloading: a fraction of each rank's optimizer states and fp32 master weights kept and
stepped on the host CPU.

Megatron-LM's ``HybridDeviceOptimizer`` (``megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py``,
``--optimizer-cpu-offload --optimizer-offload-fraction F``) receives the distributed optimizer's shard
of this rank's parameters and moves the first ``F`` of their elements (whole tensors, in order, until
the offloaded count reaches ``F`` of the total) to the host: for each, a pinned fp32 copy that is the
master weight (``param_update_in_fp32``), a pinned gradient buffer of the same type
(``torch.empty(param.shape, dtype=param.dtype, pin_memory=...)``) and the CPU optimizer's Adam moments;
the rest keep their fp32 master and moments on the GPU. DeepSpeed's ZeRO-Offload
(``zero_optimization.offload_optimizer.device: cpu``) keeps the whole fp32 partition, its gradients and
the moments on the host: the fraction 1.

Per rank: the device's optimizer states (master + moments) are ``(1 - F)`` of what they are without
offloading; the host holds ``F x elements x (4 + 4 + optimizer bytes)`` (:func:`host_bytes_per_element`).
Per step, the offloaded part's gradients go device to host and its updated weights host to device
over the GPU's host link, and the host's CPUs run Adam on it: :func:`offload_seconds`, priced without
overlap (Megatron-LM's ``--overlap-cpu-optimizer-d2h-h2d`` is off by default and parplan's exports do
not set it; the hybrid optimizer's ``step`` waits for the copies before each CPU step).
"""

from __future__ import annotations

from parplan.solver.cost.memory import MemoryBreakdown
from parplan.solver.cost.precision import Precision

#: Adam steps a host's CPUs run, parameter elements per second: DeepSpeed's CPU-Adam in the ZeRO-Offload
#: paper (Ren et al. 2021, §6's Adam latency table: 0.22 s for 1 billion parameters on a DGX-2's CPUs).
CPU_ADAM_ELEMENTS_PER_S = 1e9 / 0.22

#: Bytes of the host's fp32 master weight and of its fp32 gradient buffer, per offloaded element.
HOST_FP32_BYTES = 4


def host_bytes_per_element(prec: Precision) -> int:
    """Host bytes per offloaded element: the fp32 master copy, the fp32 gradient buffer the device's
    gradient is copied into, and Adam's moments."""
    return 2 * HOST_FP32_BYTES + prec.optimizer_bytes


def offloaded_elements(states: MemoryBreakdown, prec: Precision, fraction: float) -> float:
    """Elements of this rank's optimizer shard (its optimizer states over ``prec``'s bytes per element)
    whose states live on the host."""
    per = prec.optimizer_state_bytes
    return fraction * states.optimizer_states / per if per and fraction else 0.0


def device_states(states: MemoryBreakdown, fraction: float) -> MemoryBreakdown:
    """The device's part of ``states``: optimizer states (master and moments) ``1 - fraction`` of them."""
    if not fraction:
        return states
    return states.replace(optimizer_states=states.optimizer_states * (1 - fraction))


def host_bytes(states: MemoryBreakdown, prec: Precision, fraction: float) -> float:
    """Host bytes one rank's offloaded optimizer holds (``states``: its model states without offloading)."""
    return offloaded_elements(states, prec, fraction) * host_bytes_per_element(prec)


def offload_seconds(elements: float, prec: Precision, host_link_bytes_per_s: float, ranks_per_host: int,
                    cpu_adam_elements_per_s: float) -> float:
    """Seconds per step one rank spends on ``elements`` offloaded elements: their gradients device to
    host (the gradient's type) and their updated weights host to device (the weight's type) over the
    rank's own host link, and the CPU step, which the host's ``ranks_per_host`` ranks share (each
    offloads as many), at ``cpu_adam_elements_per_s``. Not overlapped (module docstring)."""
    if not elements:
        return 0.0
    copies = elements * (prec.grad_bytes + prec.weight_transfer_bytes) / host_link_bytes_per_s
    return copies + ranks_per_host * elements / cpu_adam_elements_per_s

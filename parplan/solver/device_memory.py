"""The fit verdict: the reserved peak a plan makes PyTorch's caching allocator hold, against the memory a
training process can use on its device.

One rule, used by every report and every search (through :func:`allocated_budget_bytes`):

    fits  ⇔  reserved_peak(allocated_peak) ≤ usable(cluster)

**Usable memory** (:func:`device_memory`): the device's memory less what is not the process's to allocate.

- *Visible capacity*: what CUDA reports (``torch.cuda.get_device_properties().total_memory``), the datasheet
  less the driver's reserve. A preset's own reading where one exists (:attr:`GpuSpec.visible_memory_bytes`,
  each with its source); otherwise the datasheet less :data:`DRIVER_RESERVE_BYTES`, the reserve measured on an
  H100 80GB (80 GiB datasheet, 85,017,493,504 B reported: bench/out/gpu-2026-11-23/env.json). Presets whose
  memory is an ``nvidia-smi`` reading (:attr:`GpuSpec.memory_is_smi_reading`) lose only
  :data:`SMI_TO_CUDA_BYTES`, the same H100's gap between ``nvidia-smi``'s total (81,559 MiB) and CUDA's.
  ``--gpu-memory-gib`` states the capacity itself (no driver reserve is known for an unnamed device).
- *CUDA context* (:data:`CONTEXT_BYTES`): the process's memory outside PyTorch's allocator (context, loaded
  kernel images), read from PyTorch's out-of-memory messages, which print the process's memory in use and
  what the allocator holds: 79.27 GiB in use, 74.53 allocated + 4.23 reserved-unallocated on an A800 80GB
  (github.com/hahnyuan/PB-LLM/issues/3), 0.51 GiB outside; 44.40 − 43.94 − 0.04 = 0.42 GiB on an RTX 6000
  Ada (github.com/DINGYANB/MTVCrafter/issues/21). The larger is taken.
- *Communicators' buffers* (:func:`communicator_bytes`), on more than one GPU: NCCL's per-connection FIFOs
  for its three protocols, ``DEFAULT_BUFFSIZE`` 4 MiB (Simple), ``DEFAULT_LL128_BUFFSIZE`` 120·640·8·8 =
  4,915,200 B and ``DEFAULT_LL_BUFFSIZE`` 8·512·8·16 = 524,288 B (NCCL ``src/init.cc``), one set per
  channel of a ring, :data:`NCCL_CHANNELS` channels (the 32 coll channels NCCL's init log prints on 8-GPU
  NVSwitch nodes), for :data:`COMMUNICATORS` communicators (the data-parallel group and one model-parallel
  group). An assumption of the cluster, not of the plan, so every search has one budget.

**Reserved peak** (:func:`reserved_peak_bytes`): the allocator's block rounding (``c10/cuda/
CUDACachingAllocator.cpp``): requests above 10 MiB get a segment rounded up to 2 MiB (``kRoundLarge``),
requests of 1–10 MiB share 20 MiB segments (``kLargeBuffer``), requests up to 1 MiB share 2 MiB segments
(``kSmallBuffer``). The peak is rounded up to 2 MiB and one segment of each pool is added, the least the
allocator holds beyond what is allocated.

Known limitations: fragmentation beyond the rounding (cached blocks that the peak's requests cannot reuse)
is not modelled, as no pair of allocated and reserved peaks of a multi-GPU run has been measured here
(bench/memory_accuracy_published.py shows how far published reserved figures sit above);
``expandable_segments`` (which torchtitan's launch script sets) lowers the gap further.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from parplan.solver.cluster import Cluster, GpuSpec

MIB = 2**20
GIB = 2**30

#: The H100 80GB's driver reserve: 80 GiB datasheet less 85,017,493,504 B CUDA reports (measured).
DRIVER_RESERVE_BYTES = 80 * GIB - 85_017_493_504
#: The same H100's nvidia-smi total (81,559 MiB) less CUDA's total (measured).
SMI_TO_CUDA_BYTES = 81_559 * MIB - 85_017_493_504
#: Memory of a training process outside PyTorch's allocator (0.51 GiB, PB-LLM issue 3).
CONTEXT_BYTES = 522 * MIB
#: NCCL's FIFO for one connection of one channel: Simple + LL128 + LL protocols (NCCL src/init.cc).
NCCL_CONNECTION_BYTES = 4 * MIB + 120 * 640 * 8 * 8 + 8 * 512 * 8 * 16
#: Channels of one NCCL communicator (NCCL's 32 coll channels on NVSwitch nodes).
NCCL_CHANNELS = 32
#: Communicators a training rank holds buffers for (data-parallel, one model-parallel group).
COMMUNICATORS = 2
#: The caching allocator's constants: large segments rounded to 2 MiB, 20 MiB and 2 MiB shared segments.
ROUND_LARGE_BYTES = 2 * MIB
LARGE_BUFFER_BYTES = 20 * MIB
SMALL_BUFFER_BYTES = 2 * MIB


@dataclass(frozen=True)
class DeviceMemory:
    """What one device gives a training process, bytes: ``visible`` (CUDA's total) less ``context`` and
    ``communicators`` is ``usable``; ``datasheet`` is the preset's (or the override's) figure."""

    datasheet_bytes: int
    visible_bytes: int
    context_bytes: int
    communicator_bytes: int

    @property
    def usable_bytes(self) -> int:
        return self.visible_bytes - self.context_bytes - self.communicator_bytes


@dataclass(frozen=True)
class FitVerdict:
    """A plan's allocated and reserved peaks against its device's usable memory."""

    allocated_peak_bytes: float
    reserved_peak_bytes: int
    usable_bytes: int

    @property
    def fits(self) -> bool:
        return self.reserved_peak_bytes <= self.usable_bytes


@dataclass(frozen=True)
class HostVerdict:
    """What one machine's host memory holds for optimizer offloading (:mod:`parplan.solver.cost.offload`):
    each of its ``gpus_per_host`` devices' offloaded optimizer (the most loaded stage's, a bound),
    against its host memory (None: unknown, not checked)."""

    bytes_per_host: float
    host_memory_bytes: int | None

    @property
    def fits(self) -> bool:
        return self.host_memory_bytes is None or self.bytes_per_host <= self.host_memory_bytes

    @property
    def reason(self) -> str | None:
        """Why the plan does not fit the host; None when it does."""
        if self.fits:
            return None
        return (f"the offloaded optimizer needs {self.bytes_per_host / 2**30:.1f} GiB of host memory per machine, "
                f"above its {(self.host_memory_bytes or 0) / 2**30:.1f} GiB")


def host_verdict(host_bytes_per_device: float, cluster: Cluster) -> HostVerdict:
    """:class:`HostVerdict` of a plan whose devices each hold ``host_bytes_per_device`` on the host."""
    return HostVerdict(host_bytes_per_device * cluster.gpus_per_host, cluster.host_memory_bytes)


def visible_bytes(gpu: GpuSpec) -> int:
    """CUDA's total memory of ``gpu``: its reading, else the datasheet less the measured H100 reserve."""
    if gpu.visible_memory_bytes is not None:
        return gpu.visible_memory_bytes
    if gpu.memory_is_smi_reading:
        return gpu.memory_bytes - SMI_TO_CUDA_BYTES
    return gpu.memory_bytes - DRIVER_RESERVE_BYTES


def communicator_bytes(num_devices: int) -> int:
    """NCCL's buffers on one rank of a job on ``num_devices`` GPUs (none on one GPU)."""
    if num_devices <= 1:
        return 0
    return COMMUNICATORS * NCCL_CHANNELS * NCCL_CONNECTION_BYTES


def device_memory(cluster: Cluster) -> DeviceMemory:
    """The usable memory of one device of ``cluster`` and its terms."""
    if cluster.memory_bytes_override is not None:
        visible = datasheet = cluster.memory_bytes_override
    else:
        datasheet, visible = cluster.gpu.memory_bytes, visible_bytes(cluster.gpu)
    return DeviceMemory(datasheet, visible, CONTEXT_BYTES, communicator_bytes(cluster.num_devices))


def reserved_peak_bytes(allocated_peak_bytes: float) -> int:
    """The least the caching allocator reserves at an allocated peak: rounded up to 2 MiB, plus one shared
    20 MiB large segment and one 2 MiB small segment."""
    pages = -(-math.ceil(allocated_peak_bytes) // ROUND_LARGE_BYTES)
    return pages * ROUND_LARGE_BYTES + LARGE_BUFFER_BYTES + SMALL_BUFFER_BYTES


def verdict(allocated_peak_bytes: float, cluster: Cluster) -> FitVerdict:
    """Whether a plan whose most loaded device allocates ``allocated_peak_bytes`` fits ``cluster``."""
    return FitVerdict(allocated_peak_bytes, reserved_peak_bytes(allocated_peak_bytes),
                      device_memory(cluster).usable_bytes)


def allocated_budget_bytes(cluster: Cluster) -> int:
    """The largest allocated peak that fits ``cluster`` (:func:`verdict`): what the searches bound a plan's
    allocated peak by. ``reserved_peak_bytes(a) ≤ usable ⇔ a ≤ this``."""
    headroom = device_memory(cluster).usable_bytes - LARGE_BUFFER_BYTES - SMALL_BUFFER_BYTES
    return max(0, headroom // ROUND_LARGE_BYTES * ROUND_LARGE_BYTES)

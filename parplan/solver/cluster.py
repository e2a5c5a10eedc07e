"""Clusters: GPU presets, links of the hierarchy, and device meshes over the devices.

A :class:`Cluster` is ``nodes`` × ``gpus_per_node`` identical devices. Devices are numbered
0 … N−1 node by node (devices ``k·G … k·G + G − 1`` share node ``k``). Two levels of links:
``intra_node`` (NVLink / xGMI / PCIe) between devices of one node and ``inter_node`` (the
InfiniBand / RoCE NIC share of one GPU) between nodes.

A :class:`DeviceMesh` factorises the devices into named axes, row-major: the last axis varies
fastest, so neighbours along it have consecutive device ids.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from parplan.solver.errors import ConfigError

#: Float dtypes a GPU may list a peak for (dense tensor-core figures where the GPU has them).
FLOAT_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")

GIB = 2**30


def _positive_finite(value: float, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or value <= 0:
        raise ConfigError(f"{what} must be a positive finite number, got {value!r}")


@dataclass(frozen=True)
class Link:
    """One level of the interconnect, as a ring collective sees it from one GPU.

    ``bandwidth_bytes_per_s`` is per direction and per GPU (what one rank can send to its ring
    neighbour while receiving as much); ``latency_seconds`` is the per-message (per ring step)
    start-up cost, the α of the α-β model.
    """

    bandwidth_bytes_per_s: float
    latency_seconds: float
    #: for a group spanning nodes (:func:`ring_link`): how its members sit on them, which an
    #: all-to-all, whose ranks all send across at once, sees instead of the ring's bandwidth
    spread: NodeSpread | None = None

    def __post_init__(self) -> None:
        _positive_finite(self.bandwidth_bytes_per_s, "link bandwidth_bytes_per_s")
        lat = self.latency_seconds
        if isinstance(lat, bool) or not isinstance(lat, int | float) or not math.isfinite(lat) or lat < 0:
            raise ConfigError(f"link latency_seconds must be a finite number >= 0, got {lat!r}")


@dataclass(frozen=True)
class NodeSpread:
    """A group spread over nodes: ``per_node`` members on each node (the fewest, where nodes
    differ), ``intra`` between members of one node, ``inter`` one GPU's own share of the network."""

    per_node: int
    intra: Link
    inter: Link


@dataclass(frozen=True)
class GpuSpec:
    """Datasheet figures of one accelerator model.

    ``peak_flops`` maps dtype (``fp32``, ``tf32``, ``bf16``, ``fp16``, ``fp8``) to dense peak
    FLOP/s (no structured sparsity); a dtype the hardware lacks is absent.
    """

    name: str
    memory_bytes: int
    peak_flops: Mapping[str, float]
    hbm_bandwidth_bytes_per_s: float
    intra_node: Link
    inter_node: Link
    default_gpus_per_node: int
    #: GPUs one machine holds (a launcher's node: one torchrun / one hostfile entry), where that is
    #: fewer than a node's NVLink domain: a GB200 compute tray holds 4 of its rack's 72. None: a node
    #: is one machine.
    gpus_per_host: int | None = None
    #: The memory CUDA reports (``torch.cuda.get_device_properties().total_memory``) where a reading of
    #: this model exists; None: derived by :func:`parplan.solver.device_memory.visible_bytes`.
    visible_memory_bytes: int | None = None
    #: ``memory_bytes`` is an ``nvidia-smi`` reading rather than the datasheet's figure.
    memory_is_smi_reading: bool = False
    #: The GPU's link to its host's memory, one direction (PCIe x16, NVLink-C2C): what optimizer
    #: offloading moves gradients and weights over.
    host_link_bytes_per_s: float = 32e9
    #: Host memory of one machine (a launcher's node: ``gpus_per_host`` GPUs, else the node's) in its
    #: reference system's default configuration; None: no reference system, not checked unless given.
    host_memory_bytes: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "peak_flops", MappingProxyType(dict(self.peak_flops)))
        if self.memory_bytes <= 0:
            raise ConfigError(f"GPU {self.name!r}: memory_bytes must be > 0, got {self.memory_bytes}")
        for dtype, flops in self.peak_flops.items():
            if dtype not in FLOAT_DTYPES:
                raise ConfigError(f"GPU {self.name!r}: unknown dtype {dtype!r}; "
                                  f"known: {', '.join(FLOAT_DTYPES)}")
            _positive_finite(flops, f"GPU {self.name!r} peak_flops[{dtype!r}]")
        _positive_finite(self.hbm_bandwidth_bytes_per_s, f"GPU {self.name!r} hbm_bandwidth_bytes_per_s")
        if self.default_gpus_per_node <= 0:
            raise ConfigError(f"GPU {self.name!r}: default_gpus_per_node must be > 0")

    def __hash__(self) -> int:
        return hash((self.name, self.memory_bytes, tuple(sorted(self.peak_flops.items())),
                     self.hbm_bandwidth_bytes_per_s, self.intra_node, self.inter_node,
                     self.default_gpus_per_node, self.visible_memory_bytes))

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype``; ConfigError if the GPU has no such math."""
        try:
            return self.peak_flops[dtype]
        except KeyError:
            raise ConfigError(f"GPU {self.name!r} has no {dtype} peak; it supports: "
                              f"{', '.join(self.peak_flops)}") from None


# --- Links. Bandwidths are datasheet peaks halved to one direction; latencies are typical
# --- α values of NCCL/RCCL (a few µs per step), an assumption rather than a datasheet figure.

#: V100 SXM2: NVLink 2, 300 GB/s total bidirectional per GPU (NVIDIA Tesla V100 datasheet).
_NVLINK2 = Link(bandwidth_bytes_per_s=150e9, latency_seconds=3e-6)
#: A100 SXM: NVLink 3, 600 GB/s bidirectional per GPU (NVIDIA A100 datasheet).
_NVLINK3 = Link(bandwidth_bytes_per_s=300e9, latency_seconds=3e-6)
#: H100 / H200 SXM: NVLink 4, 900 GB/s bidirectional per GPU (NVIDIA H100 and H200 datasheets).
_NVLINK4 = Link(bandwidth_bytes_per_s=450e9, latency_seconds=3e-6)
#: B200 (HGX / DGX B200) and GB200 NVL72: NVLink 5, 1.8 TB/s bidirectional per GPU (NVIDIA HGX B200
#: and GB200 NVL72 specifications).
_NVLINK5 = Link(bandwidth_bytes_per_s=900e9, latency_seconds=3e-6)
#: MI300X: 7 Infinity Fabric links × 128 GB/s bidirectional = 896 GB/s (AMD Instinct MI300X datasheet).
_XGMI_MI300X = Link(bandwidth_bytes_per_s=448e9, latency_seconds=3e-6)
#: PCIe Gen4 x16: 64 GB/s bidirectional (NVIDIA L4 datasheet; RTX 4090 is PCIe 4.0 x16 as well).
_PCIE4 = Link(bandwidth_bytes_per_s=32e9, latency_seconds=5e-6)

#: Host links, one direction: PCIe Gen3 x16 16 GB/s (V100 SXM2 datasheet: 32 GB/s bidirectional), Gen4
#: x16 32 GB/s (A100 datasheet: 64 GB/s), Gen5 x16 64 GB/s (H100 / H200 datasheets: 128 GB/s; HGX B200
#: specifications: PCIe Gen5 x16; AMD Instinct MI300X datasheet: PCIe Gen 5 x16, 128 GB/s).
_PCIE3_HOST, _PCIE4_HOST, _PCIE5_HOST = 16e9, 32e9, 64e9
#: GB200: NVLink-C2C, 900 GB/s bidirectional between a Grace CPU and the two B200 beside it (NVIDIA
#: GB200 NVL72 specifications): 225 GB/s one way for each GPU.
_C2C_HOST = 225e9
TB = 10**12
#: Host memory of each preset's reference machine (datasheets' default configurations): DGX-1 512 GB;
#: DGX A100 320 GB 1 TB, DGX A100 640 GB 2 TB; DGX H100 and DGX H200 2 TB; DGX B200 2 TB (configurable
#: to 4 TB); a GB200 NVL72 compute tray 2 Grace CPUs x 480 GB LPDDR5X = 960 GB for its 4 GPUs.
_HOST_DGX1, _HOST_1TB, _HOST_2TB, _HOST_GB200_TRAY = 512 * 10**9, TB, 2 * TB, 960 * 10**9

#: DGX-1 (V100): 4 × 100 Gb/s EDR InfiniBand for 8 GPUs = 6.25 GB/s per GPU (NVIDIA DGX-1 datasheet).
_IB_EDR_DGX1 = Link(bandwidth_bytes_per_s=6.25e9, latency_seconds=8e-6)
#: DGX A100: 8 × 200 Gb/s HDR InfiniBand, one per GPU = 25 GB/s (NVIDIA DGX A100 datasheet).
_IB_HDR = Link(bandwidth_bytes_per_s=25e9, latency_seconds=8e-6)
#: DGX H100 / H200: 8 × 400 Gb/s NDR InfiniBand (ConnectX-7), one per GPU = 50 GB/s
#: (NVIDIA DGX H100 datasheet); DGX B200 has the same eight single-port ConnectX-7 cards at 400 Gb/s
#: (NVIDIA DGX B200 user guide), DGX GB200 one per GPU as well (four per compute tray of four GPUs).
#: MI300X platforms pair each GPU with a 400 Gb/s NIC as well (AMD Instinct MI300X platform brief).
_IB_NDR = Link(bandwidth_bytes_per_s=50e9, latency_seconds=8e-6)
#: PCIe inference / workstation servers (L4, RTX 4090): assume 200 Gb/s Ethernet per 8-GPU node,
#: i.e. 25 Gb/s = 3.125 GB/s per GPU. No datasheet: a typical deployment, change it by calibration.
_ETH_25G = Link(bandwidth_bytes_per_s=3.125e9, latency_seconds=15e-6)


def gpu_family(name: str) -> str:
    """A GPU preset's name without its memory size (``H100-80GB`` -> ``H100``; ``L4`` -> ``L4``)."""
    return name.rsplit("-", 1)[0] if name.endswith("GB") else name


def _v100(memory_gib: int) -> GpuSpec:
    # NVIDIA Tesla V100 datasheet (SXM2): FP32 15.7 TFLOPS, tensor (FP16) 125 TFLOPS, HBM2 900 GB/s.
    # No bf16 / tf32 / fp8 math.
    return GpuSpec(
        name=f"V100-{memory_gib}GB", memory_bytes=memory_gib * GIB,
        peak_flops={"fp32": 15.7e12, "fp16": 125e12},
        hbm_bandwidth_bytes_per_s=900e9, intra_node=_NVLINK2, inter_node=_IB_EDR_DGX1,
        default_gpus_per_node=8, host_link_bytes_per_s=_PCIE3_HOST, host_memory_bytes=_HOST_DGX1)


def _a100(memory_gib: int, hbm_bytes_per_s: float, visible_bytes: int) -> GpuSpec:
    # NVIDIA A100 Tensor Core GPU datasheet (SXM): FP32 19.5 TFLOPS, TF32 156, BF16 312, FP16 312
    # (dense; the datasheet's doubled figures are with sparsity). No fp8.
    return GpuSpec(
        name=f"A100-{memory_gib}GB", memory_bytes=memory_gib * GIB,
        peak_flops={"fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12, "fp16": 312e12},
        hbm_bandwidth_bytes_per_s=hbm_bytes_per_s, intra_node=_NVLINK3, inter_node=_IB_HDR,
        default_gpus_per_node=8, visible_memory_bytes=visible_bytes, host_link_bytes_per_s=_PCIE4_HOST,
        host_memory_bytes=_HOST_1TB if memory_gib == 40 else _HOST_2TB)


# NVIDIA H100 / H200 datasheets (SXM): FP32 67 TFLOPS; TF32 989, BF16/FP16 1979, FP8 3958 TFLOPS
# *with sparsity*, i.e. dense 494.7, 989.4, 1978.9.
_HOPPER_FLOPS = {"fp32": 67e12, "tf32": 494.7e12, "bf16": 989.4e12, "fp16": 989.4e12, "fp8": 1978.9e12}

#: Known GPUs by canonical name.
GPU_PRESETS: Mapping[str, GpuSpec] = MappingProxyType({
    "V100-16GB": _v100(16),
    "V100-32GB": _v100(32),
    # A100 datasheet: 40GB SXM HBM2 1,555 GB/s; 80GB SXM HBM2e 2,039 GB/s. CUDA's total, as PyTorch's
    # out-of-memory messages print it: 39.50 GiB on an A100 40GB (github.com/TianheWu/CoSeR/issues/10),
    # 79.25 GiB on an A100 80GB (github.com/levihsu/OOTDiffusion/issues/235; an A800 80GB printed 79.33).
    "A100-40GB": _a100(40, 1555e9, round(39.50 * GIB)),
    "A100-80GB": _a100(80, 2039e9, round(79.25 * GIB)),
    # H100 datasheet (SXM): 80 GB HBM3, 3.35 TB/s.
    "H100-80GB": GpuSpec(
        name="H100-80GB", memory_bytes=80 * GIB, peak_flops=_HOPPER_FLOPS,
        hbm_bandwidth_bytes_per_s=3.35e12, intra_node=_NVLINK4, inter_node=_IB_NDR,
        default_gpus_per_node=8,
        # measured: torch.cuda.get_device_properties().total_memory (bench/out/gpu-2026-11-23/env.json)
        visible_memory_bytes=85_017_493_504, host_link_bytes_per_s=_PCIE5_HOST, host_memory_bytes=_HOST_2TB),
    # H200 datasheet (SXM): 141 GB HBM3e, 4.8 TB/s; same compute as H100 SXM.
    "H200-141GB": GpuSpec(
        name="H200-141GB", memory_bytes=141 * GIB, peak_flops=_HOPPER_FLOPS,
        hbm_bandwidth_bytes_per_s=4.8e12, intra_node=_NVLINK4, inter_node=_IB_NDR,
        default_gpus_per_node=8, host_link_bytes_per_s=_PCIE5_HOST, host_memory_bytes=_HOST_2TB),
    # NVIDIA HGX B200 specifications (eight B200 at 1,000 W): FP32 600 TFLOPS, TF32 18, BF16/FP16 36,
    # FP8 72 PFLOPS *with sparsity*, i.e. per GPU dense FP32 75 TFLOPS, TF32 1,125, BF16/FP16 2,250,
    # FP8 4,500 TFLOPS; HBM3e 8 TB/s (DGX B200: 64 TB/s for 8 GPUs). Memory: 180 GB per GPU on the
    # datasheets (DGX B200: 1,440 GB for 8); nvidia-smi reports 183,359 MiB on B200 systems (public
    # logs), i.e. 179.06 GiB: the preset holds 179 GiB.
    "B200-180GB": GpuSpec(
        name="B200-180GB", memory_bytes=179 * GIB,
        peak_flops={"fp32": 75e12, "tf32": 1125e12, "bf16": 2250e12, "fp16": 2250e12, "fp8": 4500e12},
        hbm_bandwidth_bytes_per_s=8e12, intra_node=_NVLINK5, inter_node=_IB_NDR,
        default_gpus_per_node=8, memory_is_smi_reading=True, host_link_bytes_per_s=_PCIE5_HOST,
        host_memory_bytes=_HOST_2TB),
    # NVIDIA GB200 NVL72 specifications (72 Blackwell GPUs at 1,200 W in one NVLink domain): FP32 5,760
    # TFLOPS; TF32 180, BF16/FP16 360, FP8 720 PFLOPS *with sparsity*, i.e. per GPU dense FP32 80 TFLOPS,
    # TF32 1,250, BF16/FP16 2,500, FP8 5,000 TFLOPS; HBM3e 13.4 TB and 576 TB/s for 72 (186 GB, 8 TB/s a
    # GPU); nvidia-smi reports 189,471 MiB (185.03 GiB, public logs): 185 GiB. A "node" is the rack's
    # NVLink domain, 72 GPUs (NVLink 5 between any two); across racks each GPU has its own 400 Gb/s
    # ConnectX-7 (DGX GB200 user guide: four per compute tray of four GPUs). Runs that use 64 GPUs of a
    # rack (Megatron-Bridge's scripts do) say so with --gpus-per-node 64. Launchers start one process
    # group per compute tray (4 GPUs, one machine): the exports' --nnodes / --nproc-per-node.
    "GB200-186GB": GpuSpec(
        name="GB200-186GB", memory_bytes=185 * GIB,
        peak_flops={"fp32": 80e12, "tf32": 1250e12, "bf16": 2500e12, "fp16": 2500e12, "fp8": 5000e12},
        hbm_bandwidth_bytes_per_s=8e12, intra_node=_NVLINK5, inter_node=_IB_NDR,
        default_gpus_per_node=72, gpus_per_host=4, memory_is_smi_reading=True, host_link_bytes_per_s=_C2C_HOST,
        host_memory_bytes=_HOST_GB200_TRAY),
    # NVIDIA L4 datasheet: 24 GB GDDR6, 300 GB/s; FP32 30.3 TFLOPS; TF32 120, BF16/FP16 242,
    # FP8 485 TFLOPS with sparsity → dense 60, 121, 242.5.
    "L4": GpuSpec(
        name="L4", memory_bytes=24 * GIB,
        peak_flops={"fp32": 30.3e12, "tf32": 60e12, "bf16": 121e12, "fp16": 121e12, "fp8": 242.5e12},
        hbm_bandwidth_bytes_per_s=300e9, intra_node=_PCIE4, inter_node=_ETH_25G,
        default_gpus_per_node=8),
    # NVIDIA Ada Lovelace architecture whitepaper (GeForce RTX 4090): 24 GB GDDR6X, 1,008 GB/s;
    # FP32 82.6 TFLOPS; dense tensor TF32 82.6, BF16/FP16 (FP32 accumulate, as training uses)
    # 165.2, FP8 (FP32 accumulate) 330.3 TFLOPS.
    "RTX-4090": GpuSpec(
        name="RTX-4090", memory_bytes=24 * GIB,
        peak_flops={"fp32": 82.6e12, "tf32": 82.6e12, "bf16": 165.2e12, "fp16": 165.2e12, "fp8": 330.3e12},
        hbm_bandwidth_bytes_per_s=1008e9, intra_node=_PCIE4, inter_node=_ETH_25G,
        default_gpus_per_node=8,
        # CUDA's total as PyTorch's out-of-memory message prints it on an RTX 4090: 23.68 GiB
        # (github.com/zai-org/CogVideo/issues/36)
        visible_memory_bytes=round(23.68 * GIB)),
    # AMD Instinct MI300X datasheet: 192 GB HBM3, 5.3 TB/s; FP32 163.4 TFLOPS (matrix and vector);
    # dense TF32 653.7, BF16/FP16 1307.4, FP8 2614.9 TFLOPS.
    "MI300X": GpuSpec(
        name="MI300X", memory_bytes=192 * GIB,
        peak_flops={"fp32": 163.4e12, "tf32": 653.7e12, "bf16": 1307.4e12, "fp16": 1307.4e12,
                    "fp8": 2614.9e12},
        hbm_bandwidth_bytes_per_s=5.3e12, intra_node=_XGMI_MI300X, inter_node=_IB_NDR,
        default_gpus_per_node=8, host_link_bytes_per_s=_PCIE5_HOST),
})


def _normalise(name: str) -> str:
    return re.sub(r"[\s_]+", "-", name.strip()).upper()


def gpu_preset(name: str) -> GpuSpec:
    """The preset called ``name`` (case-insensitive; ``_`` or spaces may stand for ``-``).

    A name without its memory suffix is accepted when only one preset has it (``h100`` →
    ``H100-80GB``); an ambiguous one (``a100``) or an unknown one raises ConfigError listing
    the known names.
    """
    key = _normalise(name)
    if key in GPU_PRESETS:
        return GPU_PRESETS[key]
    family = [n for n in GPU_PRESETS if re.sub(r"-\d+GB$", "", n) == key]
    if len(family) == 1:
        return GPU_PRESETS[family[0]]
    known = ", ".join(GPU_PRESETS)
    if family:
        raise ConfigError(f"ambiguous GPU {name!r}: say which of {', '.join(family)}; known GPUs: {known}")
    raise ConfigError(f"unknown GPU {name!r}; known GPUs: {known}")


@dataclass(frozen=True)
class Cluster:
    """``nodes`` × ``gpus_per_node`` devices of one GPU model.

    The ``*_override`` fields, when set, replace the preset's device memory or links (a
    ``--gpu-memory-gib`` flag, or bandwidths measured by calibration).
    """

    nodes: int
    gpus_per_node: int
    gpu: GpuSpec
    memory_bytes_override: int | None = None
    intra_node_override: Link | None = None
    inter_node_override: Link | None = None
    #: host memory of one machine (``--host-memory-gib``), replacing the preset's
    host_memory_bytes_override: int | None = None

    def __post_init__(self) -> None:
        for what, v in (("nodes", self.nodes), ("gpus_per_node", self.gpus_per_node)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ConfigError(f"cluster {what} must be a positive integer, got {v!r}")
        if self.memory_bytes_override is not None and self.memory_bytes_override <= 0:
            raise ConfigError(f"device memory must be > 0 bytes, got {self.memory_bytes_override}")
        if self.host_memory_bytes_override is not None and self.host_memory_bytes_override <= 0:
            raise ConfigError(f"host memory must be > 0 bytes, got {self.host_memory_bytes_override}")

    @property
    def num_devices(self) -> int:
        """Total number of devices."""
        return self.nodes * self.gpus_per_node

    @property
    def device_memory_bytes(self) -> int:
        """Memory of one device in bytes (the override when set, else the preset's)."""
        return self.memory_bytes_override if self.memory_bytes_override is not None else self.gpu.memory_bytes

    @property
    def intra_node(self) -> Link:
        """Link between devices of one node."""
        return self.intra_node_override or self.gpu.intra_node

    @property
    def inter_node(self) -> Link:
        """Link between devices of different nodes (one GPU's share of the node's NICs)."""
        return self.inter_node_override or self.gpu.inter_node

    @property
    def gpus_per_host(self) -> int:
        """GPUs one machine holds (whose host memory and CPUs they share)."""
        return min(self.gpu.gpus_per_host or self.gpus_per_node, self.gpus_per_node)

    @property
    def host_memory_bytes(self) -> int | None:
        """Host memory of one machine (the override when set, else the preset's; None: unknown)."""
        return self.host_memory_bytes_override or self.gpu.host_memory_bytes

    def node_of(self, device: int) -> int:
        """Index of the node that holds device id ``device``."""
        return device // self.gpus_per_node


def make_cluster(gpus: int, gpus_per_node: int | None = None, gpu: str = "A100-80GB",
                 gpu_memory_gib: float | None = None, host_memory_gib: float | None = None) -> Cluster:
    """Build a cluster of ``gpus`` devices, ``gpus_per_node`` per node (default: the preset's).

    Fewer GPUs than ``gpus_per_node`` make one node of ``gpus`` devices; more must be a
    multiple of ``gpus_per_node``. ``gpu_memory_gib`` overrides the device memory (GiB),
    ``host_memory_gib`` one machine's host memory.
    Raises ConfigError on any inconsistency.
    """
    spec = gpu_preset(gpu)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus <= 0:
        raise ConfigError(f"gpus must be a positive integer, got {gpus!r}")
    per_node = spec.default_gpus_per_node if gpus_per_node is None else gpus_per_node
    if isinstance(per_node, bool) or not isinstance(per_node, int) or per_node <= 0:
        raise ConfigError(f"gpus_per_node must be a positive integer, got {per_node!r}")
    if gpus > per_node and gpus % per_node:
        default = ", the preset's default" if gpus_per_node is None else ""
        raise ConfigError(f"gpus ({gpus}) must be a multiple of gpus_per_node ({per_node}{default}) "
                          f"when the cluster spans several nodes; set gpus_per_node to the GPUs that share "
                          f"a node's NVLink in the job (e.g. 64 of a 72-GPU GB200 rack)")
    nodes, per_node = (gpus // per_node, per_node) if gpus >= per_node else (1, gpus)
    memory: int | None = None
    if gpu_memory_gib is not None:
        _positive_finite(gpu_memory_gib, "gpu_memory_gib")
        memory = int(gpu_memory_gib * GIB)
    host: int | None = None
    if host_memory_gib is not None:
        _positive_finite(host_memory_gib, "host_memory_gib")
        host = int(host_memory_gib * GIB)
    return Cluster(nodes=nodes, gpus_per_node=per_node, gpu=spec, memory_bytes_override=memory,
                   host_memory_bytes_override=host)


def factorizations(n: int, k: int) -> list[tuple[int, ...]]:
    """All ordered ``k``-tuples of positive integers whose product is ``n`` (lexicographic order).

    ``factorizations(4, 2) == [(1, 4), (2, 2), (4, 1)]``; ``k == 0`` gives ``[()]`` for ``n == 1``.
    """
    if n <= 0 or k < 0:
        raise ConfigError(f"factorizations needs n > 0 and k >= 0, got n={n}, k={k}")
    if k == 0:
        return [()] if n == 1 else []
    if k == 1:
        return [(n,)]
    out: list[tuple[int, ...]] = []
    for d in range(1, n + 1):
        if n % d == 0:
            out.extend((d, *rest) for rest in factorizations(n // d, k - 1))
    return out


def ring_link(ranks: int, nodes: int, intra: Link, inter: Link, per_node: int | None = None) -> Link:
    """The link a ring collective over ``ranks`` GPUs on ``nodes`` nodes sees, as one α-β link.

    - Bandwidth per GPU: a group with ``g`` members on each node (``per_node``, default
      ``ranks / nodes``; the fewest where they differ) runs one ring per member (NCCL's channels),
      each crossing nodes through its own GPU's NIC, so the group's traffic leaves a node over
      ``g`` NICs at once: ``min(intra, g · inter)``. One member per node (TP inside the node, DP
      across) gets one NIC's share.
    - Latency per ring pass: ``nodes − 1`` of the ``ranks − 1`` steps cross the network, the
      others stay on the intra-node link (NCCL's tuning model charges intra- and inter-node steps
      alike). Given as the mean per step, so that ``(ranks − 1) · latency`` is the pass's latency.

    One node gives ``intra`` itself. Several members per node also give the link a ``spread``
    (:class:`NodeSpread`), which all-to-alls are priced by.
    """
    if per_node is None:
        if nodes < 1 or ranks % nodes:
            raise ConfigError(f"a ring of {ranks} ranks cannot lie evenly on {nodes} nodes")
        per_node = ranks // nodes
    if not 1 <= nodes <= ranks or not 1 <= per_node <= ranks:
        raise ConfigError(f"a ring of {ranks} ranks cannot lie on {nodes} nodes, {per_node} on each")
    if nodes == 1:
        return intra
    steps = ranks - 1
    latency = ((steps - (nodes - 1)) * intra.latency_seconds + (nodes - 1) * inter.latency_seconds) / steps
    # one member per node: an all-to-all sees what the ring sees (every step on one GPU's network share)
    return Link(min(intra.bandwidth_bytes_per_s, per_node * inter.bandwidth_bytes_per_s), latency,
                NodeSpread(per_node, intra, inter) if per_node > 1 else None)


@functools.lru_cache(maxsize=4096)
def _group_spread(mesh_axes: tuple[tuple[str, int], ...], axes: tuple[str, ...], gpus_per_node: int) -> tuple[int, int]:
    """:meth:`DeviceMesh.group_spread` by counting every device (vectorised; kept: meshes repeat)."""
    ids = np.arange(math.prod(size for _, size in mesh_axes), dtype=np.int64)
    group = np.zeros_like(ids)  # which group each device is in: its coordinates off ``axes``
    stride = 1
    for name, size in reversed(mesh_axes):
        if name not in axes:
            group = group * size + (ids // stride) % size
        stride *= size
    nodes_total = -(-len(ids) // gpus_per_node)
    pairs, members = np.unique(group * nodes_total + ids // gpus_per_node, return_counts=True)
    _, nodes = np.unique(pairs // nodes_total, return_counts=True)
    return int(nodes.max()), int(members.min())


@dataclass(frozen=True)
class DeviceMesh:
    """Devices arranged as a row-major grid of named axes (last axis fastest-varying).

    Device id of coordinates ``(c_0, …, c_{k−1})`` is ``Σ c_i · stride(axis_i)``.
    """

    axes: tuple[tuple[str, int], ...]
    _strides: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}), repr=False,
                                        compare=False)

    def __post_init__(self) -> None:
        names = [a for a, _ in self.axes]
        if len(set(names)) != len(names):
            raise ConfigError(f"mesh axis names must be distinct, got {names}")
        strides: dict[str, int] = {}
        stride = 1
        for name, size in reversed(self.axes):
            if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
                raise ConfigError(f"mesh axis {name!r} needs a positive integer size, got {size!r}")
            strides[name] = stride
            stride *= size
        object.__setattr__(self, "_strides", MappingProxyType(strides))

    def __hash__(self) -> int:
        return hash(self.axes)

    @staticmethod
    def of(cluster: Cluster, axes: Mapping[str, int] | Iterable[tuple[str, int]]) -> DeviceMesh:
        """A mesh over ``cluster``'s devices; ConfigError unless the sizes multiply to its device count."""
        pairs = tuple(axes.items()) if isinstance(axes, Mapping) else tuple(axes)
        mesh = DeviceMesh(pairs)
        if mesh.num_devices != cluster.num_devices:
            shape = " × ".join(f"{a}={s}" for a, s in pairs) or "()"
            raise ConfigError(f"mesh {shape} has {mesh.num_devices} devices (the product of its axis sizes) "
                              f"but the cluster has {cluster.num_devices}")
        return mesh

    @property
    def names(self) -> tuple[str, ...]:
        """Axis names, outermost first."""
        return tuple(a for a, _ in self.axes)

    @property
    def num_devices(self) -> int:
        """Product of the axis sizes."""
        return math.prod(s for _, s in self.axes)

    def _check(self, axis: str) -> None:
        if axis not in self._strides:
            have = ", ".join(self.names) or "no axes"
            raise ConfigError(f"unknown mesh axis {axis!r}; the mesh has {have}")

    def size(self, axis: str) -> int:
        """Number of devices along ``axis``."""
        self._check(axis)
        return dict(self.axes)[axis]

    def stride(self, axis: str) -> int:
        """Device-id distance between neighbours along ``axis`` (product of the later axes' sizes)."""
        self._check(axis)
        return self._strides[axis]

    def within_node(self, axis: str, cluster: Cluster) -> bool:
        """Whether every group of devices along ``axis`` lies inside one node.

        True iff ``stride·size`` divides ``gpus_per_node`` (then each group sits in an aligned block
        of ``stride·size`` consecutive ids inside one node). A size-1 axis never communicates: True.
        """
        size, stride = self.size(axis), self.stride(axis)
        span = stride * size
        return size == 1 or (span <= cluster.gpus_per_node and cluster.gpus_per_node % span == 0)

    def link(self, axis: str, cluster: Cluster) -> Link:
        """The link a collective along ``axis`` runs over, as its ring sees it (:meth:`group_link`)."""
        return self.group_link([axis], cluster)

    def hop_link(self, axis: str, cluster: Cluster) -> Link:
        """The link one message between neighbours along ``axis`` crosses (a pipeline hand-off):
        intra-node if the groups along ``axis`` fit in a node, else one GPU's network share."""
        return cluster.intra_node if self.within_node(axis, cluster) else cluster.inter_node

    def group_spread(self, axes: Sequence[str], cluster: Cluster) -> tuple[int, int]:
        """(the most nodes a group spanning ``axes`` lies on, the fewest members such a group has on
        one of its nodes): the groups of the devices varying along all of ``axes``."""
        return _group_spread(self.axes, tuple(sorted(set(axes))), cluster.gpus_per_node)

    def group_link(self, axes: Sequence[str], cluster: Cluster) -> Link:
        """The link a ring collective over a group spanning ``axes`` sees (:func:`ring_link`), for
        the group spread widest (:meth:`group_spread`). A group inside one node (or no axes: a
        single device) gives the intra-node link."""
        if all(self.within_node(a, cluster) for a in axes):
            return cluster.intra_node
        nodes, per_node = self.group_spread(axes, cluster)
        n = math.prod(self.size(a) for a in set(axes))
        return ring_link(n, nodes, cluster.intra_node, cluster.inter_node, per_node)

    def device_coordinates(self, device: int) -> dict[str, int]:
        """Coordinates of device id ``device`` along each axis."""
        if not 0 <= device < self.num_devices:
            raise ConfigError(f"device {device} is outside the mesh of {self.num_devices} devices")
        return {a: (device // self._strides[a]) % s for a, s in self.axes}


class MeshLinks(dict[str, Link]):
    """The link of each axis of a mesh on a cluster, as its ring sees it, and of any group of
    several axes (:meth:`group`)."""

    def __init__(self, mesh: DeviceMesh, cluster: Cluster) -> None:
        super().__init__({a: mesh.link(a, cluster) for a in mesh.names})
        self._mesh, self._cluster = mesh, cluster
        self._groups: dict[frozenset[str], Link] = {}

    def group(self, axes: Sequence[str]) -> Link:
        """:meth:`DeviceMesh.group_link` of ``axes``, kept."""
        key = frozenset(axes)
        link = self._groups.get(key)
        if link is None:
            link = self._groups[key] = self._mesh.group_link(sorted(key), self._cluster)
        return link

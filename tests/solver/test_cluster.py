"""Cluster presets, make_cluster validation, device meshes and their links, calibration."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from parplan.solver.calibration import DEFAULT_CALIBRATION, Calibration, apply
from parplan.solver.cluster import (
    GIB,
    GPU_PRESETS,
    Cluster,
    DeviceMesh,
    Link,
    factorizations,
    gpu_preset,
    make_cluster,
    ring_link,
)
from parplan.solver.errors import ConfigError

PRESET_NAMES = ["V100-16GB", "V100-32GB", "A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB", "B200-180GB",
                "GB200-186GB", "L4", "RTX-4090", "MI300X"]


# --- presets -------------------------------------------------------------------------------------

def test_preset_names_and_memory() -> None:
    assert list(GPU_PRESETS) == PRESET_NAMES
    gib = [16, 32, 40, 80, 80, 141, 179, 185, 24, 24, 192]  # B200, GB200: 183,359 and 189,471 MiB by nvidia-smi
    assert [GPU_PRESETS[n].memory_bytes for n in PRESET_NAMES] == [g * GIB for g in gib]
    for name, spec in GPU_PRESETS.items():
        assert spec.name == name
        assert spec.intra_node.bandwidth_bytes_per_s > spec.inter_node.bandwidth_bytes_per_s
        assert "fp32" in spec.peak_flops


def test_preset_figures() -> None:
    a100 = gpu_preset("A100-80GB")
    assert a100.peak("bf16") == 312e12
    assert "fp8" not in a100.peak_flops
    assert gpu_preset("H100-80GB").peak("bf16") == pytest.approx(989.4e12)
    b200 = gpu_preset("B200-180GB")  # HGX B200's 8-GPU figures with sparsity, halved, per GPU
    assert (b200.peak("bf16"), b200.peak("fp8"), b200.peak("tf32")) == (36e15 / 16, 72e15 / 16, 18e15 / 16)
    assert b200.intra_node.bandwidth_bytes_per_s == 1.8e12 / 2  # NVLink 5, one direction
    gb200 = gpu_preset("GB200-186GB")  # GB200 NVL72's 72-GPU figures with sparsity, halved, per GPU
    assert (gb200.peak("bf16"), gb200.peak("fp8")) == (360e15 / 144, 720e15 / 144)
    assert gb200.default_gpus_per_node == 72  # a node is the rack's NVLink domain
    assert make_cluster(144, gpu="GB200").nodes == 2
    with pytest.raises(ConfigError, match="fp8"):
        a100.peak("fp8")


@pytest.mark.parametrize(("query", "name"), [
    ("a100-80gb", "A100-80GB"), ("A100_40GB", "A100-40GB"), (" h100-80GB ", "H100-80GB"),
    ("h100", "H100-80GB"), ("H200", "H200-141GB"), ("b200", "B200-180GB"),
    ("gb200", "GB200-186GB"), ("l4", "L4"), ("rtx 4090", "RTX-4090"),
    ("mi300x", "MI300X"),
])
def test_preset_lookup(query: str, name: str) -> None:
    assert gpu_preset(query).name == name


@pytest.mark.parametrize("query", ["a100", "V100", "tpu-v5", ""])
def test_preset_lookup_errors_list_names(query: str) -> None:
    with pytest.raises(ConfigError) as e:
        gpu_preset(query)
    for name in PRESET_NAMES:
        assert name in str(e.value)


def test_specs_hashable() -> None:
    c = make_cluster(16)
    assert hash(c) == hash(make_cluster(16))
    assert hash(DEFAULT_CALIBRATION) == hash(Calibration())


# --- make_cluster --------------------------------------------------------------------------------

def test_make_cluster_defaults() -> None:
    c = make_cluster(16)
    assert (c.nodes, c.gpus_per_node, c.num_devices) == (2, 8, 16)
    assert c.gpu.name == "A100-80GB"
    assert c.device_memory_bytes == 80 * GIB


def test_make_cluster_small_is_one_node() -> None:
    c = make_cluster(4, gpus_per_node=8, gpu="h100")
    assert (c.nodes, c.gpus_per_node, c.num_devices) == (1, 4, 4)


def test_make_cluster_memory_override() -> None:
    c = make_cluster(8, gpu_memory_gib=40)
    assert c.device_memory_bytes == 40 * GIB
    assert c.gpu.memory_bytes == 80 * GIB


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"gpus": 0}, "gpus"), ({"gpus": -8}, "gpus"), ({"gpus": 8, "gpus_per_node": 0}, "gpus_per_node"),
    ({"gpus": 12, "gpus_per_node": 8}, "multiple"), ({"gpus": 8, "gpu": "a100"}, "ambiguous"),
    ({"gpus": 8, "gpu_memory_gib": 0}, "gpu_memory_gib"),
    ({"gpus": 8, "gpu_memory_gib": -1.0}, "gpu_memory_gib"),
])
def test_make_cluster_errors(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        make_cluster(**kwargs)  # type: ignore[arg-type]


def test_cluster_rejects_bad_counts() -> None:
    with pytest.raises(ConfigError):
        Cluster(nodes=0, gpus_per_node=8, gpu=gpu_preset("L4"))


# --- factorizations ------------------------------------------------------------------------------

@pytest.mark.parametrize(("n", "k"), [(12, 2), (12, 3), (1, 3), (16, 4), (7, 2), (1, 1), (5, 1)])
def test_factorizations_brute_force(n: int, k: int) -> None:
    want = sorted(t for t in itertools.product(range(1, n + 1), repeat=k) if math.prod(t) == n)
    assert factorizations(n, k) == want


def test_factorizations_12_2() -> None:
    assert factorizations(12, 2) == [(1, 12), (2, 6), (3, 4), (4, 3), (6, 2), (12, 1)]
    assert factorizations(1, 0) == [()]
    assert factorizations(2, 0) == []
    with pytest.raises(ConfigError):
        factorizations(0, 2)


# --- device meshes -------------------------------------------------------------------------------

def test_mesh_strides_and_sizes() -> None:
    mesh = DeviceMesh.of(make_cluster(16), {"pp": 2, "dp": 2, "tp": 4})
    assert [mesh.size(a) for a in ("pp", "dp", "tp")] == [2, 2, 4]
    assert [mesh.stride(a) for a in ("pp", "dp", "tp")] == [8, 4, 1]
    assert mesh.device_coordinates(13) == {"pp": 1, "dp": 1, "tp": 1}
    with pytest.raises(ConfigError, match="unknown mesh axis"):
        mesh.size("sp")


def test_mesh_product_must_match() -> None:
    with pytest.raises(ConfigError, match=r"12 devices.*16"):
        DeviceMesh.of(make_cluster(16), {"dp": 3, "tp": 4})


def test_link_dp2_tp8() -> None:
    c = make_cluster(16, gpus_per_node=8)
    mesh = DeviceMesh.of(c, {"dp": 2, "tp": 8})
    assert mesh.link("tp", c) == c.intra_node
    assert mesh.link("dp", c) == c.inter_node


def test_link_tp2_dp8() -> None:
    c = make_cluster(16, gpus_per_node=8)
    mesh = DeviceMesh.of(c, {"tp": 2, "dp": 8})
    assert mesh.link("dp", c) == c.intra_node  # dp is the fast axis: stride 1, 8 per node
    # tp has stride 8: its pairs (i, i + 8) straddle the two nodes.
    assert mesh.link("tp", c) == c.inter_node


def test_link_dp8_tp2() -> None:
    c = make_cluster(16, gpus_per_node=8)
    mesh = DeviceMesh.of(c, {"dp": 8, "tp": 2})
    assert mesh.link("tp", c) == c.intra_node
    # dp has stride 2: each group holds 4 devices of each node, so 4 NICs per node carry its rings
    assert mesh.link("dp", c) == ring_link(8, 2, c.intra_node, c.inter_node)
    assert mesh.link("dp", c).bandwidth_bytes_per_s == min(c.intra_node.bandwidth_bytes_per_s,
                                                           4 * c.inter_node.bandwidth_bytes_per_s)
    assert mesh.hop_link("dp", c) == c.inter_node
    assert mesh.group_link(["tp"], c) == c.intra_node
    assert mesh.group_link(["dp", "tp"], c) == ring_link(16, 2, c.intra_node, c.inter_node)


def test_link_all_intra_on_one_node() -> None:
    c = make_cluster(8)
    mesh = DeviceMesh.of(c, {"pp": 2, "dp": 2, "tp": 2})
    for axis in mesh.names:
        assert mesh.link(axis, c) == c.intra_node
    assert mesh.group_link(["pp", "dp", "tp"], c) == c.intra_node


def test_group_link_spanning_axes() -> None:
    c = make_cluster(32, gpus_per_node=8)
    mesh = DeviceMesh.of(c, {"dp": 4, "pp": 2, "tp": 4})
    assert mesh.group_link(["pp", "tp"], c) == c.intra_node
    assert mesh.group_link(["dp", "tp"], c) == ring_link(16, 4, c.intra_node, c.inter_node)
    assert mesh.group_link([], c) == c.intra_node


def test_ring_link_closed_form() -> None:
    """A ring of 64 ranks, 8 on each of 8 nodes: 7 of its 63 steps cross the network; the 8
    members of a node send over 8 NICs. One member per node: one NIC's bandwidth, every step
    crosses the network."""
    intra, inter = Link(300e9, 3e-6), Link(25e9, 8e-6)
    ring = ring_link(64, 8, intra, inter)
    assert ring.bandwidth_bytes_per_s == 200e9
    assert ring.latency_seconds * 63 == pytest.approx(56 * 3e-6 + 7 * 8e-6)
    assert ring_link(8, 8, intra, inter) == inter
    assert ring_link(8, 1, intra, inter) == intra
    assert ring_link(64, 2, intra, inter).bandwidth_bytes_per_s == 300e9  # NVLink-bound
    with pytest.raises(ConfigError):
        ring_link(6, 4, intra, inter)


def _groups_within_node(mesh: DeviceMesh, axes: list[str], cluster: Cluster) -> bool:
    """Brute force: every group of devices varying only along ``axes`` sits in one node."""
    groups: dict[tuple[int, ...], set[int]] = {}
    others = [a for a in mesh.names if a not in axes]
    for dev in range(mesh.num_devices):
        coords = mesh.device_coordinates(dev)
        groups.setdefault(tuple(coords[a] for a in others), set()).add(cluster.node_of(dev))
    return all(len(nodes) == 1 for nodes in groups.values())


def _spread(mesh: DeviceMesh, axes: list[str], cluster: Cluster) -> tuple[int, int]:
    """Brute force: (most nodes a group of devices varying only along ``axes`` spans, fewest
    members a group has on one node)."""
    groups: dict[tuple[int, ...], list[int]] = {}
    others = [a for a in mesh.names if a not in axes]
    for dev in range(mesh.num_devices):
        coords = mesh.device_coordinates(dev)
        groups.setdefault(tuple(coords[a] for a in others), []).append(cluster.node_of(dev))
    nodes = max(len(set(g)) for g in groups.values())
    fewest = min(g.count(k) for g in groups.values() for k in set(g))
    return nodes, fewest


@given(st.sampled_from([1, 2, 3, 4, 6, 8]), st.integers(1, 4), st.integers(1, 3), st.data())
def test_group_link_matches_brute_force(gpn: int, nodes: int, k: int, data: st.DataObject) -> None:
    c = make_cluster(gpn * nodes, gpus_per_node=gpn)
    sizes = data.draw(st.sampled_from(factorizations(c.num_devices, k)))
    mesh = DeviceMesh.of(c, {f"a{i}": s for i, s in enumerate(sizes)})
    subset = data.draw(st.lists(st.sampled_from(mesh.names), unique=True))
    if _groups_within_node(mesh, subset, c):
        want = c.intra_node
    else:
        n = math.prod(mesh.size(a) for a in subset)
        nodes, fewest = _spread(mesh, subset, c)
        want = ring_link(n, nodes, c.intra_node, c.inter_node, fewest)
    assert mesh.group_link(subset, c) == want


# --- calibration ---------------------------------------------------------------------------------

def test_calibration_defaults() -> None:
    assert DEFAULT_CALIBRATION.matmul_efficiency_for("bf16") == 0.55
    assert DEFAULT_CALIBRATION.matmul_efficiency_for("fp16") == 0.55
    assert DEFAULT_CALIBRATION.matmul_efficiency_for("fp32") == 0.5
    assert DEFAULT_CALIBRATION.memory_efficiency == 0.8
    assert DEFAULT_CALIBRATION.source == "default"


def test_calibration_round_trip() -> None:
    import json

    cal = Calibration(matmul_efficiency={"bf16": 0.61}, memory_efficiency=0.7,
                      intra_node=Link(230e9, 4e-6), inter_node=None, source="agent:H100-80GB@2025-01-31")
    data = json.loads(json.dumps(cal.to_dict()))
    assert Calibration.from_dict(data) == cal
    assert Calibration.from_dict(DEFAULT_CALIBRATION.to_dict()) == DEFAULT_CALIBRATION
    assert Calibration.from_dict({}) == DEFAULT_CALIBRATION
    assert cal.matmul_efficiency_for("fp32") == 0.5  # unlisted dtype: the fallback


@pytest.mark.parametrize(("data", "match"), [
    ({"memory_efficiency": 0}, "memory_efficiency"),
    ({"memory_efficiency": 1.5}, "memory_efficiency"),
    ({"matmul_efficiency": {"bf16": -0.1}}, "matmul_efficiency"),
    ({"matmul_efficiency": {"bf16": float("nan")}}, "matmul_efficiency"),
    ({"matmul_efficiency": {"int8": 0.5}}, "dtype"),
    ({"intra_node": {"bandwidth_bytes_per_s": 0, "latency_seconds": 1e-6}}, "intra_node"),
    ({"inter_node": {"bandwidth_bytes_per_s": 1e9, "latency_seconds": -1}}, "inter_node"),
    ({"inter_node": {"bandwidth_bytes_per_s": 1e9}}, "inter_node"),
    ({"bogus": 1}, "unknown calibration keys"),
])
def test_calibration_validation(data: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Calibration.from_dict(data)


def test_apply_overrides_links() -> None:
    c = make_cluster(16, gpu="H100-80GB")
    measured = Link(200e9, 5e-6)
    c2 = apply(c, Calibration(intra_node=measured, source="agent:test"))
    assert c2.intra_node == measured
    assert c2.inter_node == c.inter_node == c.gpu.inter_node
    assert c.intra_node == c.gpu.intra_node  # the original is untouched
    assert apply(c, DEFAULT_CALIBRATION) == c
    mesh = DeviceMesh.of(c2, {"dp": 2, "tp": 8})
    assert mesh.link("tp", c2) == measured

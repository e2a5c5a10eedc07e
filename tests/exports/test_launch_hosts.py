"""Launch lines count machines, not NVLink domains: on a GB200 NVL72 rack parplan's node is the
rack's NVLink domain (72 GPUs, or the 64 a job uses), while torchrun, DeepSpeed's launcher and
Galvatron's run one process group per compute tray of 4 GPUs (the preset's ``gpus_per_host``)."""

from __future__ import annotations

from typing import Any

import pytest
from plan_docs import doc_for, torchrun_namespace

from parplan.exports import export_plan


def _gb200_doc(gpus: int, per_node: int, tp: int = 4) -> dict[str, Any]:
    doc = doc_for("llama-3-8b", gpus, {"tp": tp, "pp": 1, "dp": gpus // tp, "num_microbatches": 1}, per_node=per_node)
    doc["cluster"]["gpu"] = "GB200-186GB"
    return doc


def _torchrun_counts(line: str) -> tuple[str, str]:
    ns = torchrun_namespace(line)
    return ns.nnodes, ns.nproc_per_node


@pytest.mark.parametrize(("gpus", "per_node"), [(144, 72), (128, 64), (8, 72)])
@pytest.mark.parametrize("target", ["megatron", "torchtitan"])
def test_torchrun_starts_one_process_group_per_gb200_compute_tray(target: str, gpus: int, per_node: int) -> None:
    export = export_plan(_gb200_doc(gpus, per_node), target)
    assert len(export.launch) == gpus // 4
    for line in export.launch:
        assert _torchrun_counts(line) == (str(gpus // 4), "4")


def test_deepspeeds_hostfile_has_four_slots_a_gb200_tray() -> None:
    export = export_plan(_gb200_doc(144, 72, tp=1), "deepspeed")
    assert "--num_nodes 36 --num_gpus 4" in export.launch[0]


def test_an_8_gpu_server_is_one_launcher_node() -> None:
    doc = doc_for("llama-3-8b", 16, {"tp": 4, "pp": 1, "dp": 4, "num_microbatches": 1})
    doc["cluster"]["gpu"] = "H100-80GB"
    for line in export_plan(doc, "megatron").launch:
        assert _torchrun_counts(line) == ("2", "8")

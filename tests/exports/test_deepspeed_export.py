"""DeepSpeed exports, checked by DeepSpeed's own ``DeepSpeedConfig`` at the plan's world size.

``DeepSpeedConfig`` reads the data-parallel world size from the model-parallel unit once
``torch.distributed`` is up, then checks the batch sizes against it. It runs in a fresh process
(a one-rank gloo group) so the group does not leak into other tests.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from typing import Any

import pytest
from plan_docs import doc_for

from parplan.exports import NotExpressibleError, export_plan
from parplan.solver.cost.runtime import Runtime

pytest.importorskip("deepspeed", reason="the exports extra (deepspeed) is not installed")

CHECK = r"""
import json, os, sys, warnings
warnings.simplefilter("ignore")
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2], RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
import deepspeed.ops
# On CPU, DeepSpeed's comm backend compiles its shared-memory all-reduce (a C++ extension: minutes of
# both CI cores on a fresh machine) when it starts. Reading a config runs no collective: left out.
deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
import deepspeed.comm as dist
dist.init_distributed(dist_backend="gloo", verbose=False)
from deepspeed.runtime.config import DeepSpeedConfig

class Unit:  # the model-parallel unit DeepSpeed asks for the data-parallel world size
    def __init__(self, dp): self.dp = dp
    def get_data_parallel_world_size(self): return self.dp
    def get_model_parallel_world_size(self): return 1

cases = json.loads(sys.stdin.read())
out = []
for cfg, dp in cases:
    try:
        c = DeepSpeedConfig(cfg, mpu=Unit(dp))
        out.append({"world": c.world_size, "batch": c.train_batch_size, "micro": c.train_micro_batch_size_per_gpu,
                    "accumulation": c.gradient_accumulation_steps, "stage": c.zero_optimization_stage,
                    "bf16": c.bfloat16_config.enabled if hasattr(c, "bfloat16_config") else c.bfloat16_enabled})
    except Exception as e:  # noqa: BLE001 - reported to the test
        out.append({"error": f"{type(e).__name__}: {e}"})
print(json.dumps(out))
"""


def deepspeed_reads(cases: list[tuple[dict[str, Any], int]], port: int) -> list[dict[str, Any]]:
    r = subprocess.run([sys.executable, "-c", CHECK, "x", str(port)], input=json.dumps(cases), capture_output=True,
                       text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    result: list[dict[str, Any]] = json.loads(r.stdout.strip().splitlines()[-1])
    return result


PLANS = [
    ("llama-3-8b", 8, {"tp": 1, "pp": 1, "dp": 8, "zero": 3, "micro_batch": 2, "num_microbatches": 4,
                       "recompute": "full"}),
    ("gpt-1.7b", 64, {"tp": 1, "pp": 1, "dp": 64, "zero": 2, "micro_batch": 4, "num_microbatches": 1}),
    ("llama-2-7b", 1024, {"tp": 1, "pp": 1, "dp": 1024, "zero": 1, "micro_batch": 1, "num_microbatches": 2}),
    ("mixtral-8x7b", 64, {"tp": 1, "pp": 1, "dp": 64, "zero": 0, "micro_batch": 1, "num_microbatches": 8}),
]


def test_deepspeed_accepts_the_exported_config_at_the_plans_world_size() -> None:
    exported = [(name, gpus, s, export_plan(doc_for(name, gpus, s), "deepspeed")) for name, gpus, s in PLANS]
    cases = [(json.loads(e.files["ds_config.json"]), s["dp"]) for _, _, s, e in exported]
    # the oracle can fail: the same config at another world size breaks DeepSpeed's batch check
    cases.append((cases[0][0], cases[0][1] * 2))
    got = deepspeed_reads(cases, 29611)
    for (name, gpus, s, e), g in zip(exported, got, strict=False):
        assert "error" not in g, (name, g)
        assert g["world"] == s["dp"] == gpus
        assert (g["batch"], g["micro"], g["accumulation"]) == (s["micro_batch"] * s["num_microbatches"] * s["dp"],
                                                               s["micro_batch"], s["num_microbatches"])
        assert g["stage"] == s["zero"] and g["bf16"] is True
        assert e.version == "0.19.8" and len(e.launch) == 1
        assert f"--num_nodes {max(1, gpus // 8)} " in e.launch[0]
    assert "error" in got[-1] and "batch" in got[-1]["error"].lower()


@pytest.mark.parametrize(("strategy", "reason"), [
    ({"tp": 2, "pp": 1, "dp": 4}, "tensor parallelism"),
    ({"tp": 1, "pp": 2, "dp": 4}, "PipelineModule"),
    ({"tp": 1, "pp": 1, "dp": 8, "expert_parallel": 8}, "expert parallelism"),
    ({"tp": 1, "pp": 1, "dp": 2, "cp": 4}, "context parallelism"),
])
def test_what_deepspeed_cannot_run_is_refused_with_the_reason(strategy: dict[str, Any], reason: str) -> None:
    with pytest.raises(NotExpressibleError) as info:
        export_plan(doc_for("mixtral-8x7b", 8, {"num_microbatches": 1} | strategy), "deepspeed")
    assert any(reason in r for r in info.value.reasons), info.value.reasons


def test_the_exported_buckets_are_what_the_deepspeed_runtime_prices() -> None:
    """The export caps DeepSpeed's buckets at DEEPSPEED_BUCKET_ELEMENTS; the deepspeed runtime holds
    them (fp32, a reduce and a gather bucket) through the whole step, on top of what the same strategy
    holds under Megatron-LM's rules (plus PyTorch's loss buffer), less Transformer Engine's workspace:
    both hold cuBLAS's, Megatron-LM Transformer Engine's besides."""
    from parplan.imports import read_config
    from parplan.solver.cost.plan_memory import plan_memory
    from parplan.solver.cost.runtime import DEEPSPEED_BUCKET_BYTES, DEEPSPEED_BUCKET_ELEMENTS, TE_WORKSPACE_BYTES
    from parplan.solver.frontends.presets import get_preset
    from parplan.solver.models import ModelSource

    for zero in (0, 1, 2, 3):
        doc = doc_for("llama-2-7b", 8, {"tp": 1, "pp": 1, "dp": 8, "zero": zero, "micro_batch": 1,
                                         "num_microbatches": 2})
        text = export_plan(doc, "deepspeed").files["ds_config.json"]
        zcfg = json.loads(text)["zero_optimization"]
        assert zcfg["reduce_bucket_size"] == DEEPSPEED_BUCKET_ELEMENTS
        if zero == 3:
            live, prefetch = zcfg["stage3_max_live_parameters"], zcfg["stage3_prefetch_bucket_size"]
            assert live == prefetch == DEEPSPEED_BUCKET_ELEMENTS
        model = ModelSource("llama-2-7b", config=get_preset("llama-2-7b"))
        imported = read_config("ds-config", text, model=model, gpus=8, seq_len=4096)
        assert imported.unpriced == []  # the exported buckets are all priced
        graph = model.build(1, 4096)
        ds = plan_memory(graph, imported.strategy).peak_stage
        mega = plan_memory(graph, dataclasses.replace(imported.strategy, runtime=Runtime.MEGATRON)).peak_stage
        fixed = DEEPSPEED_BUCKET_BYTES - TE_WORKSPACE_BYTES  # cuBLAS's workspaces in both
        assert ds.memory.bytes.temporary >= mega.memory.bytes.temporary + fixed
        assert ds.peak_bytes >= mega.peak_bytes + fixed


def test_a_plan_priced_for_another_runtime_says_so() -> None:
    """A target-any plan (Megatron-LM's buffers; its ZeRO-1 uniform plans run with
    --overlap-param-gather) is exported with notes saying what DeepSpeed runs differently."""
    s = {"tp": 1, "pp": 1, "dp": 8, "zero": 1, "num_microbatches": 2}
    own = export_plan(doc_for("llama-2-7b", 8, s | {"runtime": "deepspeed"}), "deepspeed").notes
    other = export_plan(doc_for("llama-2-7b", 8, s | {"runtime": "megatron", "overlap_param_gather": True}),
                        "deepspeed").notes
    assert not any("runtime" in n or "overlap-param-gather" in n for n in own)
    assert any("priced for runtime megatron" in n for n in other)
    assert any("--overlap-param-gather" in n for n in other)

"""Optimizer offloading through the exports and back through the imports: Megatron-LM's
``--optimizer-cpu-offload --optimizer-offload-fraction F`` and DeepSpeed's
``zero_optimization.offload_optimizer`` (read by DeepSpeed's own ``DeepSpeedZeroConfig``)."""

from __future__ import annotations

import json

import pytest
from plan_docs import doc_for

from parplan.exports import NotExpressibleError, export_plan
from parplan.imports import read_config
from parplan.imports.common import Imported
from parplan.solver.frontends.presets import get_preset
from parplan.solver.models import ModelSource


@pytest.mark.parametrize("fraction", [0.5, 1.0])
def test_megatron_flags_read_back_as_the_fraction(fraction: float) -> None:
    doc = doc_for("llama-3-8b", 8, {"tp": 2, "pp": 1, "dp": 4, "zero": 1, "sequence_parallel": True,
                                    "num_microbatches": 4, "optimizer_offload": fraction})
    exported = export_plan(doc, "megatron")
    args = exported.files["megatron_args.txt"]
    assert f"--optimizer-offload-fraction {fraction:g}" in args and "--use-precision-aware-optimizer" in args
    imported = read_config("megatron-args", exported.files["launch_megatron.sh"], gpus=8)
    assert isinstance(imported, Imported)
    assert imported.strategy.optimizer_offload == fraction and imported.strategy.zero == 1
    assert not imported.unknown, imported.report()


def test_megatron_import_refuses_offload_without_the_precision_aware_optimizer() -> None:
    doc = doc_for("llama-3-8b", 8, {"tp": 2, "pp": 1, "dp": 4, "zero": 1, "sequence_parallel": True,
                                    "num_microbatches": 4, "optimizer_offload": 1.0})
    launch = export_plan(doc, "megatron").files["launch_megatron.sh"].replace(" --use-precision-aware-optimizer", "")
    with pytest.raises(Exception, match="--use-precision-aware-optimizer"):
        read_config("megatron-args", launch, gpus=8)


def test_deepspeed_offload_optimizer_round_trip() -> None:
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    doc = doc_for("llama-3-8b", 8, {"tp": 1, "pp": 1, "dp": 8, "zero": 2, "num_microbatches": 1,
                                    "optimizer_offload": 1.0})
    text = export_plan(doc, "deepspeed").files["ds_config.json"]
    zero = DeepSpeedZeroConfig(**json.loads(text)["zero_optimization"])
    assert zero.offload_optimizer is not None and zero.offload_optimizer.device == "cpu"
    model = ModelSource("llama-3-8b", config=get_preset("llama-3-8b"))
    imported = read_config("ds-config", text, model=model, gpus=8)
    assert isinstance(imported, Imported)
    assert imported.strategy.optimizer_offload == 1.0 and imported.strategy.zero == 2


def test_deepspeed_partial_or_nvme_offload_is_refused() -> None:
    doc = doc_for("llama-3-8b", 8, {"tp": 1, "pp": 1, "dp": 8, "zero": 2, "num_microbatches": 1,
                                    "optimizer_offload": 0.5})
    with pytest.raises(NotExpressibleError, match="whole optimizer"):
        export_plan(doc, "deepspeed")
    model = ModelSource("llama-3-8b", config=get_preset("llama-3-8b"))
    for offload, words in (({"device": "cpu", "ratio": 0.3}, "ratio"), ({"device": "nvme"}, "nvme")):
        cfg = {"train_batch_size": 8, "zero_optimization": {"stage": 3, "offload_optimizer": offload}}
        with pytest.raises(Exception, match=words):
            read_config("ds-config", json.dumps(cfg), model=model, gpus=8)

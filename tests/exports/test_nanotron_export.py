"""nanotron's YAML config: a nanotron configuration written, read back by ``--from nanotron-config``, is
the same strategy and prices the same (planned ones: tests/exports/test_round_trip.py); what nanotron
cannot run is refused with every reason."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from parplan.exports import NotExpressibleError, export_plan
from parplan.imports import price, read_config
from parplan.imports.nanotron import SCHEMA
from parplan.solver.cluster import make_cluster
from parplan.solver.cost.nanotron import nanotron_partition

#: a tiny Llama on 8 GPUs, every setting parplan reads set away from its default
CONFIG: dict[str, Any] = {
    "general": {"project": "t", "run": "r"},
    "parallelism": {"dp": 2, "tp": 2, "pp": 2, "pp_engine": "afab", "tp_mode": "REDUCE_SCATTER",
                    "tp_linear_async_communication": True, "recompute_layer": True},
    "model": {"dtype": "bfloat16", "init_method": {"std": 0.02}, "make_vocab_size_divisible_by": 64,
              "model_config": {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 8,
                               "num_key_value_heads": 4, "num_hidden_layers": 6, "vocab_size": 1000,
                               "tie_word_embeddings": False}},
    "tokens": {"sequence_length": 512, "micro_batch_size": 2, "batch_accumulation_per_replica": 4, "train_steps": 1},
    "optimizer": {"zero_stage": 1, "accumulate_grad_in_fp32": True, "weight_decay": 0.0, "clip_grad": 1.0,
                  "optimizer_factory": {"name": "adamW", "adam_beta1": 0.9, "adam_beta2": 0.95, "adam_eps": 1e-8,
                                        "torch_adam_is_fused": True},
                  "learning_rate_scheduler": {"learning_rate": 1e-3}},
}


def _priced(text: str, gpus: int = 8) -> dict[str, Any]:
    imported = read_config("nanotron-config", text, gpus=gpus)
    assert imported.gpus is not None
    return price(imported, make_cluster(imported.gpus, 8, "H100-80GB"))


def test_a_config_exports_and_reads_back_the_same() -> None:
    doc = _priced(yaml.safe_dump(CONFIG))
    s = doc["strategy"]
    # vocabulary padded to a multiple of 64 x tp 2 (helpers._vocab_size_with_padding): 1,024
    assert doc["model"]["architecture"]["vocab"] == 1024
    assert (s["tp"], s["pp"], s["dp"], s["zero"], s["sequence_parallel"], s["recompute"], s["schedule"],
            s["micro_batch"], s["num_microbatches"], s["runtime"]) == (2, 2, 2, 1, True, "full", "gpipe", 2, 4,
                                                                       "nanotron")
    # nanotron's split: layer 4·8·32·256 + 3·512·256 = 655,360, head 1,024·256 = 262,144, total 4,194,304;
    # rank 0's threshold 2,097,152 is passed by the fourth layer (2,621,440)
    assert s["partition"] == [4, 2] == list(nanotron_partition(6, 256, 8, 512, 1024, 2))
    exported = export_plan(doc, "nanotron")
    written = yaml.safe_load(exported.files["nanotron_config.yaml"])
    # every key written is one nanotron's loader knows (its dacite is strict)
    for section, keys in SCHEMA.items():
        part = written["model"]["model_config"] if section == "model_config" else written[section]
        assert set(part) <= keys, (section, set(part) - keys)
    again = _priced(exported.files["nanotron_config.yaml"])
    assert again["strategy"] == doc["strategy"]
    assert again["memory"]["peak_bytes"] == doc["memory"]["peak_bytes"]


@pytest.mark.parametrize(("change", "why"), [
    ({"zero": 3}, "ZeRO-3"),
    ({"schedule": "interleaved", "virtual_stages": 2}, "interleaved"),
    ({"recompute": "selective"}, "selective recomputation"),
    ({"partition": [3, 3]}, "nanotron splits them [4, 2]"),
])
def test_what_nanotron_cannot_run_is_refused(change: dict[str, Any], why: str) -> None:
    doc = _priced(yaml.safe_dump(CONFIG))
    changed = {**doc, "strategy": {**doc["strategy"], **change}}
    with pytest.raises(NotExpressibleError, match=re.escape(why)):
        export_plan(changed, "nanotron")

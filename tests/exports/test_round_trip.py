"""Export, then import: the configuration a trainer is given prices the same as the plan it came from.

For each target with an import (Megatron-LM arguments, DeepSpeed config, torchtitan arguments,
Galvatron's strategy file with its launch flags, nanotron's YAML config: its Llama only), on
GPT, Llama and Mixtral presets at 8, 64 and 1,024 GPUs: the target's plan, exported, read back
from the exported files and priced again with ``parplan memory --from``'s path, gives the plan's
memory and step time (to rounding) and its strategy.
"""

from __future__ import annotations

from typing import Any

import pytest

from parplan.exports import NotExpressibleError, export_plan
from parplan.imports import price, read_config
from parplan.solver.cluster import make_cluster
from parplan.solver.frontends.presets import get_preset
from parplan.solver.models import ModelSource
from parplan.solver.planner import solve
from parplan.solver.request import parse_plan_request

#: target -> (import kind, the exported file it reads, presets: GPT-, Llama- and Mixtral-shaped
#: where the trainer runs them; torchtitan 0.3.0 has Llama 3 recipes only)
TARGETS = {
    "megatron": ("megatron-args", "launch_megatron.sh", ["gpt-7.5b", "llama-3-70b", "mixtral-8x7b"]),
    "deepspeed": ("ds-config", "ds_config.json", ["gpt-7.5b", "llama-2-7b", "mixtral-8x7b"]),
    "torchtitan": ("torchtitan-config", "launch_torchtitan.sh", ["llama-3-8b", "llama-3-70b", "llama-3-405b"]),
    "galvatron": ("galvatron-config", "galvatron_config.json", ["gpt-7.5b", "llama-2-7b", "mixtral-8x7b"]),
    "nanotron": ("nanotron-config", "nanotron_config.yaml", ["llama-2-7b", "llama-3-8b", "llama-3-70b"]),
}
#: what a trainer cannot run by design (the test expects exactly these refusals besides "nothing fits")
BY_DESIGN = {"galvatron": "mixture-of-experts"}


def plan(target: str, preset: str, gpus: int) -> dict[str, Any]:
    body = {"model": {"preset": preset}, "cluster": {"gpus": gpus, "gpus_per_node": 8, "gpu": "H100-80GB"},
            "training": {"global_batch": 2 * gpus}, "objective": {"kind": "min-memory"},
            "target": target}
    return solve(parse_plan_request(body))


@pytest.mark.slow
@pytest.mark.parametrize("target", list(TARGETS))
def test_export_then_import_prices_the_same(target: str) -> None:
    kind, file, presets = TARGETS[target]
    checked: list[str] = []
    refused: list[str] = []
    for preset in presets:
        for gpus in (8, 64, 1024):
            doc = plan(target, preset, gpus)
            if doc.get("memory") is None:
                refused.append(f"{preset}@{gpus}: nothing fits")
                continue
            try:
                exported = export_plan(doc, target)
            except NotExpressibleError as e:
                refused.append(f"{preset}@{gpus}: {e}")
                continue
            # DeepSpeed's and Galvatron's files do not describe the model: the user names it
            model = ModelSource(preset, config=get_preset(preset)) if kind in ("ds-config", "galvatron-config") \
                else None
            imported = read_config(kind, exported.files[file], model=model,
                                   gpus=gpus if kind != "torchtitan-config" else None,
                                   seq_len=doc["model"]["seq_len"], launch=exported.files.get("train_galvatron.sh"))
            assert imported.gpus == gpus and not imported.unknown, imported.report()
            assert imported.model is not None
            again = price(imported, make_cluster(gpus, 8, "H100-80GB"))
            assert again["strategy"]["summary"] == doc["strategy"]["summary"], (preset, gpus)
            assert again["memory"]["peak_bytes"] == doc["memory"]["peak_bytes"], (preset, gpus)
            assert again["time"]["step_seconds"] == pytest.approx(doc["time"]["step_seconds"], rel=1e-9)
            checked.append(f"{preset}@{gpus}")
    # every shape the trainer runs is checked at every scale where a plan fits
    assert len(checked) >= 6, (checked, refused)
    assert all("nothing fits" in r or BY_DESIGN.get(target, "-") in r for r in refused), refused

"""Plan documents for the export tests, written by hand (no search runs): the keys of
``parplan plan --json`` that exports read."""

from __future__ import annotations

import dataclasses
from typing import Any

from parplan.solver.frontends.presets import get_preset


def doc_for(preset: str, gpus: int, strategy: dict[str, Any], per_node: int = 8) -> dict[str, Any]:
    arch = dataclasses.asdict(get_preset(preset))
    base = {"kind": "uniform", "zero": 0, "sequence_parallel": False, "recompute": "selective", "micro_batch": 1,
            "schedule": "1f1b", "virtual_stages": 1, "precision": "bf16", "expert_parallel": 1,
            "summary": "test"}
    s = base | strategy
    s.setdefault("global_batch", s["micro_batch"] * s["num_microbatches"] * s["dp"])
    return {"model": {"name": preset, "seq_len": arch["seq_len"], "architecture": arch},
            "cluster": {"gpus": gpus, "gpus_per_node": min(gpus, per_node)}, "strategy": s}

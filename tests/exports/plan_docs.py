"""Plan documents for the export tests, written by hand (no search runs): the keys of
``parplan plan --json`` that exports read; and a launch line read back by torchrun's own parser."""

from __future__ import annotations

import dataclasses
import shlex
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


def torchrun_namespace(line: str) -> Any:
    """A launch line read by torchrun's own argument parser (MASTER_ADDR/PORT as the shell sets them)."""
    from torch.distributed.run import get_args_parser

    tokens = shlex.split(line.replace("$MASTER_ADDR", "10.0.0.1").replace("$MASTER_PORT", "29500"))
    while tokens[0] != "torchrun":
        assert "=" in tokens[0], f"{tokens[0]} is neither an environment setting nor torchrun"
        tokens.pop(0)
    return get_args_parser().parse_args(tokens[1:])

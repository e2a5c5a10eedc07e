"""The plan table's comparison with a target's own baseline says which way memory went."""

from __future__ import annotations

from typing import Any

import pytest

from parplan.cli_output import GIB, plan_table


def _doc(memory_saved_bytes: float, seconds_saved: float) -> dict[str, Any]:
    """The keys of a plan document the target line reads (an answer without a plan of its own)."""
    return {"memory": None, "message": "test", "baselines": {},
            "solver": {"method": "uniform", "status": "infeasible", "seconds": 0.0},
            "target": {"name": "megatron", "runtime": "megatron", "baseline": "megatron", "unpriced": [],
                       "versus_baseline": {"memory_saved_bytes": memory_saved_bytes, "seconds_saved": seconds_saved}}}


@pytest.mark.parametrize(("saved", "secs", "words"), [
    (-21.41 * GIB, 0.25, "uses 21.41 GiB more per device, 0.250 s per step faster"),
    (3.5 * GIB, -0.079, "uses 3.50 GiB less per device, 0.079 s per step slower"),
])
def test_the_target_line_says_less_or_more(saved: float, secs: float, words: str) -> None:
    text = plan_table(_doc(saved, secs))
    line = next(ln for ln in text.splitlines() if ln.startswith("target"))
    assert line == f"target    megatron (buffers of the megatron runtime): vs its baseline megatron, {words}"
    assert "saved" not in text and "-21.41" not in text


def test_a_graph_without_tokens_plans_with_no_throughput_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    """A graph that names no tokens (an MLP) has 0 tokens/s: its baselines' throughput ratio is null
    in JSON and "-" in the table, not a division by zero."""
    import json

    from parplan.cli import main

    args = ["plan", "--model", "tests/data/mlp_graph.json", "--gpus", "1", "--global-batch", "1024"]
    assert main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["time"]["tokens_per_second"] == 0
    assert all(rel is None or rel["throughput"] is None for rel in doc["relative"].values())
    assert main(args) == 0
    assert "throughput ratio" in capsys.readouterr().out

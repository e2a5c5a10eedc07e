"""One solve builds the model's graph once per micro-batch size: counted at the builder, whoever
calls it (the baselines, the method choice, the DP, the ILP, the DP's Megatron-LM reference)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from parplan.solver import models
from parplan.solver.planner import solve
from parplan.solver.request import parse_plan_request


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> Counter[tuple[int, int | None]]:
    """Graphs built from a configuration, counted by (micro-batch, sequence length)."""
    counts: Counter[tuple[int, int | None]] = Counter()
    real = models.build_graph

    def counted(cfg: Any, batch: int, seq_len: int | None = None) -> Any:
        counts[(batch, seq_len)] += 1
        return real(cfg, batch=batch, seq_len=seq_len)

    monkeypatch.setattr(models, "build_graph", counted)
    return counts


@pytest.mark.parametrize("body", [
    # one node under auto: the baselines, the DP (with the Megatron-LM reference) and the ILP
    {"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": 4, "gpus_per_node": 4}, "training": {"global_batch": 8},
     "time_limit": 120},
    # two DP searches (Galvatron's two data-parallel defaults)
    {"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": 8}, "training": {"global_batch": 16},
     "target": "galvatron", "time_limit": 120},
    # a uniform target: every strategy it runs
    {"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": 8}, "training": {"global_batch": 16},
     "target": "torchtitan", "time_limit": 120},
], ids=["auto-both", "galvatron", "torchtitan"])
def test_a_solve_builds_each_micro_batch_graph_once(body: dict[str, Any],
                                                    builds: Counter[tuple[int, int | None]]) -> None:
    doc = solve(parse_plan_request(body))
    assert doc["memory"] is not None
    assert builds, "the solve built no graph through the builder"
    repeated = {key: n for key, n in builds.items() if n > 1}
    assert not repeated, f"graphs built more than once (micro-batch, seq): {repeated}"

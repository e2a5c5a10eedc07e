"""bench/plan_vs_tuned.py's grid prices every Megatron-LM configuration (model-states floor aside);
the ``megatron`` target's plan skips what its time floors rule out. Both search the same
enumeration, so the exhaustive grid is the oracle of the target's pruned search."""

from __future__ import annotations

import os
import sys

from parplan.solver.planner import solve

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench")


def test_exhaustive_grid_finds_the_megatron_plan() -> None:
    sys.path.insert(0, BENCH)
    try:
        import plan_vs_tuned as bench
    finally:
        sys.path.remove(BENCH)
    case = ("gpt-1.7b", 8, "A100-40GB", 32)
    grid = bench.grid(bench.request(*case, "megatron"))
    doc = solve(bench.request(*case, "megatron"))
    assert grid.size > 100 and grid.step_seconds is not None
    assert doc["strategy"]["summary"] == grid.best
    assert doc["time"]["step_seconds"] == grid.step_seconds


def test_any_is_never_slower_than_the_megatron_target() -> None:
    """Mixtral 8x7B on 32 H100s: the per-layer DP alone (no interleaved schedule) takes 0.559 s a step
    where Megatron-LM's interleaved pipeline takes 0.507 s; ``any`` under ``search`` auto also runs the
    megatron target's search, so its answer is at least as fast as that target's own answer."""
    sys.path.insert(0, BENCH)
    try:
        import plan_vs_tuned as bench
    finally:
        sys.path.remove(BENCH)
    case = ("mixtral-8x7b", 32, "H100-80GB", 64)
    megatron = solve(bench.request(*case, "megatron"))
    anything = solve(bench.request(*case, "any"))
    assert "interleaved" in megatron["strategy"]["summary"]
    assert anything["time"]["step_seconds"] <= megatron["time"]["step_seconds"]


def test_any_offloads_the_optimizer_where_the_megatron_target_would() -> None:
    """GPT 18.4B on 2 H100s: no Megatron-LM configuration fits with the optimizer on the GPUs (weights and
    Adam's states alone are 16 bytes x 18.4e9 / 2 = 137 GiB a device); the megatron target offloads it to
    the host, and so does ``any`` (its megatron-family search)."""
    sys.path.insert(0, BENCH)
    try:
        import plan_vs_tuned as bench
    finally:
        sys.path.remove(BENCH)
    doc = solve(bench.request("gpt-18.4b", 2, "H100-80GB", 256, "any"))
    assert doc["memory"] is not None and doc["memory"]["fits"]
    assert doc["strategy"]["optimizer_offload"] > 0

"""deepseek-v3, gemma-3-27b and gpt-oss-120b plan end to end from the CLI (issue 13, presets): the
DP on 64 H100s where the model can fit, the ILP for the dense one on one node, a clear infeasible
answer where it cannot; exports that would drop an architecture feature refuse in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from parplan.cli import main
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.presets import get_preset

H100 = ["--gpus-per-node", "8", "--gpu", "H100-80GB"]
GIB = 2**30


def _parameters(name: str) -> int:
    """The preset's parameter count (equal to its closed form and the published figures:
    tests/solver/test_param_counts.py)."""
    return build_graph(get_preset(name)).parameter_count()

pytestmark = pytest.mark.slow


def _plan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, object]]:
    rc = main(["plan", *args, *H100, "--json"])
    return rc, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", ["gemma-3-27b", "gpt-oss-120b"])
def test_preset_plans_on_64_h100s_with_the_dp(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    rc, doc = _plan(capsys, "--model", name, "--gpus", "64", "--search", "dp")
    assert rc == 0
    assert doc["model"]["parameters"] == _parameters(name)  # type: ignore[index]
    memory, solver = doc["memory"], doc["solver"]
    assert memory["fits"] and 0 < memory["peak_bytes"] <= 80 * GIB  # type: ignore[index, operator]
    assert (solver["method"], solver["status"]) == ("dp", "optimal")  # type: ignore[index]
    # what a trainer would run without the model's sliding windows, sinks or sandwich norms is another model
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(doc))
    assert main(["export", str(plan), "--target", "megatron", "--out", str(tmp_path / "mlm")]) != 0
    err = capsys.readouterr().err
    assert "sliding-window attention" in err and "Traceback" not in err


def test_deepseek_v3_does_not_fit_64_h100s(capsys: pytest.CaptureFixture[str]) -> None:
    """671B parameters cannot train on 64 GPUs of 80 GiB: even ZeRO-3 over all 64 holds 18 bytes per
    parameter / 64 of model states (bf16 weights, fp32 gradients, master weights and Adam moments),
    176 GiB. The DP says so, with the least memory a plan needs, at least that."""
    rc, doc = _plan(capsys, "--model", "deepseek-v3", "--gpus", "64", "--search", "dp")
    assert rc != 0
    assert doc["solver"]["status"] == "infeasible"  # type: ignore[index]
    params = _parameters("deepseek-v3")
    assert doc["least_memory_bytes"] >= 18 * params / 64  # type: ignore[operator]
    # the bound is what an H100 leaves a process of a 64-GPU job: 79.18 GiB CUDA reports, less 0.51 GiB of
    # context and 0.57 GiB of NCCL buffers, less the allocator's 22 MiB of shared segments (docs/fit.md)
    assert "no strategy fits 78.1 GiB" in str(doc["message"])
    # no more than any baseline needs (Megatron-LM's plan needed 200.3 GiB, below the DP's own least)
    baselines: dict[str, Any] = doc["baselines"]  # type: ignore[assignment]
    peaks = [b["memory"]["peak_bytes"] for b in baselines.values() if b]
    assert doc["least_memory_bytes"] <= min(peaks) + 1  # type: ignore[operator]


def test_deepseek_v3_plans_on_1024_h100s(capsys: pytest.CaptureFixture[str]) -> None:
    rc, doc = _plan(capsys, "--model", "deepseek-v3", "--gpus", "1024", "--search", "dp")
    assert rc == 0
    assert doc["model"]["parameters"] == _parameters("deepseek-v3")  # type: ignore[index]
    assert doc["memory"]["fits"] and doc["memory"]["peak_bytes"] <= 80 * GIB  # type: ignore[index]
    assert doc["time"]["step_seconds"] > 0  # type: ignore[index]


def test_gemma3_plans_with_the_ilp_on_one_node(capsys: pytest.CaptureFixture[str]) -> None:
    rc, doc = _plan(capsys, "--model", "gemma-3-27b", "--gpus", "8", "--seq-len", "4096", "--global-batch", "8",
                    "--search", "ilp")
    assert rc == 0
    assert doc["solver"]["method"] == "ilp" and doc["memory"]["fits"]  # type: ignore[index]
    assert doc["model"]["parameters"] == _parameters("gemma-3-27b")  # type: ignore[index]

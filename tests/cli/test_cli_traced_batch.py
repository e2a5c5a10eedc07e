"""``parplan graph module:factory`` at one sample, and plans at micro-batch 1 and 4 from that one
graph (a model built on ``nn.MultiheadAttention``, as DeepSpeedExamples' SimpleTransformerModel)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from parplan.cli import main

FACTORY = Path(__file__).resolve().parents[1] / "data" / "mha_factory.py"

#: tests/data/mha_factory.py's parameters: embeddings 96x32 + 64x32; per block (2) in_proj 3*32*32 + 96,
#: out_proj 32*32 + 32, two norms 2*(32 + 32), MLP 32*128 + 128 + 128*32 + 32; output 32*96 + 96
PARAMETERS = 96 * 32 + 64 * 32 + 2 * (3 * 32 * 32 + 96 + 32 * 32 + 32 + 2 * 64 + 32 * 128 + 128 + 128 * 32 + 32) \
    + 32 * 96 + 96


def _plan(graph: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> dict[str, object]:
    capsys.readouterr()
    assert main(["plan", "--model", str(graph), "--gpus", "1", "--search", "dp", *flags, "--json"]) == 0
    doc: dict[str, object] = json.loads(capsys.readouterr().out)
    return doc


def test_one_traced_graph_plans_at_one_and_four_samples(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "mha.json"
    assert main(["graph", f"{FACTORY}:make", "--batch", "1", "--seq-len", "16", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["meta"]["batch"] == 1 and doc["meta"]["parameter_count"] == PARAMETERS
    assert next(n["dims"] for n in doc["nodes"] if n["id"] == "input_ids") == {"batch": 1, "seq": 16}
    one = _plan(out, capsys, "--global-batch", "1")
    four = _plan(out, capsys, "--global-batch", "4", "--micro-batch", "4", "--objective", "max-throughput")
    assert one["strategy"]["num_microbatches"] == 1 and four["strategy"]["num_microbatches"] == 1  # type: ignore[index]
    assert four["strategy"]["global_batch"] == 4  # type: ignore[index]
    # activations grow with the micro-batch: 4 samples hold more than 1
    assert four["memory"]["breakdown"]["activations"] > one["memory"]["breakdown"]["activations"]  # type: ignore[index]


def test_equal_batch_and_sequence_sizes_keep_their_names(tmp_path: Path) -> None:
    """Axes are named by size: a factory traced at 16 samples of 16 tokens is traced at another
    batch and resized, so ``batch`` and ``seq`` stay two dims."""
    out = tmp_path / "square.json"
    assert main(["graph", f"{FACTORY}:make", "--batch", "16", "--seq-len", "16", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert next(n["dims"] for n in doc["nodes"] if n["id"] == "input_ids") == {"batch": 16, "seq": 16}
    assert doc["meta"]["batch"] == 16 and doc["meta"]["seq_len"] == 16

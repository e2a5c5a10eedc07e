"""An architecture the tracer cannot plan is refused with one line on stderr (exit status 2), never a
traceback, by ``parplan plan`` and ``parplan graph`` alike: the line names the operator and the
module for an unmapped ATen op, the model_type for one transformers does not know, and the field for
a config that leaves out a size."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from parplan.cli import main

#: Mamba mixes tokens with a depthwise conv1d, which the tracer does not map.
MAMBA = {"model_type": "mamba", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 256, "state_size": 4,
         "expand": 2, "conv_kernel": 4}
GEMMA2 = json.loads((Path(__file__).resolve().parent.parent / "data" / "hf" / "gemma2.json").read_text())


def _error_line(tmp_path: Path, cfg: dict[str, Any], command: str, capsys: pytest.CaptureFixture[str]) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    argv = (["plan", "--model", str(path), "--gpus", "2", "--seq-len", "32", "--search", "dp"] if command == "plan"
            else ["graph", str(path), "--seq-len", "32", "--out", str(tmp_path / "g.json")])
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"parplan {command}: error: ")
    assert not (tmp_path / "g.json").exists()
    return lines[0]


@pytest.mark.parametrize("command", ["plan", "graph"])
def test_unmapped_operator_names_the_operator_and_the_module(tmp_path: Path, command: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    line = _error_line(tmp_path, MAMBA, command, capsys)
    assert "unsupported operator aten.conv1d" in line
    assert "at module 'backbone.layers.0.mixer'" in line


@pytest.mark.parametrize("command", ["plan", "graph"])
def test_unknown_model_type_is_named(tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]) -> None:
    line = _error_line(tmp_path, {**GEMMA2, "model_type": "gemma_two"}, command, capsys)
    assert "model_type 'gemma_two' is unknown to transformers" in line


@pytest.mark.parametrize("command", ["plan", "graph"])
def test_missing_size_is_named_not_defaulted(tmp_path: Path, command: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Without num_hidden_layers transformers would build its own default depth (26 for Gemma-2)."""
    cfg = {k: v for k, v in GEMMA2.items() if k != "num_hidden_layers"}
    line = _error_line(tmp_path, cfg, command, capsys)
    assert "missing required field 'num_hidden_layers'" in line


def test_a_config_that_cannot_be_built_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Heads that do not divide the hidden size: transformers refuses it while building."""
    line = _error_line(tmp_path, {**GEMMA2, "num_attention_heads": 3, "num_key_value_heads": 2}, "plan", capsys)
    assert "model_type 'gemma2'" in line

"""Qwen2 and Qwen3 ``config.json`` files plan end to end (issue 13, in part): the q/k/v biases and
q/k norms are in the graph (its parameter count is the closed form's), both searches return a plan
re-priced by the evaluator, and what cannot be written or run yet says so in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parplan.cli import main


def _config(model_type: str) -> dict[str, object]:
    cfg: dict[str, object] = {
        "model_type": model_type, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4,
        "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 1024, "max_position_embeddings": 256,
        "tie_word_embeddings": False,
    }
    if model_type == "qwen3":
        cfg["head_dim"] = 32  # 8 heads of 32 over a hidden of 128: wider than hidden / heads
    return cfg


def _params(model_type: str) -> int:
    """Closed form: embedding and head 2·V·h, per layer q/o h·a·d each, k/v h·g·d each, SwiGLU 3·h·f,
    two norms 2·h, Qwen2's biases a·d + 2·g·d, Qwen3's q/k norms 2·d; the final norm h."""
    h, f, L, a, g, V = 128, 256, 4, 8, 2, 1024
    d = 32 if model_type == "qwen3" else h // a
    layer = 2 * h * a * d + 2 * h * g * d + 3 * h * f + 2 * h
    layer += (a * d + 2 * g * d) if model_type == "qwen2" else 2 * d
    return 2 * V * h + L * layer + h


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
@pytest.mark.parametrize("search", ["dp", "ilp"])
def test_qwen_config_plans_with_both_searches(tmp_path: Path, capsys: pytest.CaptureFixture[str], model_type: str,
                                              search: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_config(model_type)))
    assert main(["plan", "--model", str(path), "--gpus", "4", "--global-batch", "8", "--seq-len", "128",
                 "--search", search, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["model"]["parameters"] == _params(model_type)
    arch = doc["model"]["architecture"]
    assert (arch["qkv_bias"], arch["qk_norm"]) == (model_type == "qwen2", model_type == "qwen3")
    assert doc["memory"]["fits"] and doc["memory"]["peak_bytes"] > 0
    assert doc["time"]["step_seconds"] > 0


def test_exports_write_or_refuse_what_they_would_drop(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Megatron-LM's export writes the biases (--add-qkv-bias); DeepSpeed's, which would launch the
    user's model without them, says so in one line."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_config("qwen2")))
    common = ["plan", "--model", str(path), "--gpus", "4", "--global-batch", "8", "--seq-len", "128"]
    assert main([*common, "--target", "megatron", "--export", str(tmp_path / "mlm")]) == 0
    capsys.readouterr()
    assert "--add-qkv-bias" in (tmp_path / "mlm" / "megatron_args.txt").read_text().split()
    assert main([*common, "--target", "deepspeed", "--export", str(tmp_path / "ds")]) == 2
    err = capsys.readouterr().err
    assert "q/k/v biases" in err and "Traceback" not in err


def test_the_agent_refuses_to_build_qwen_yet() -> None:
    from parplan.agent.model import check_supported
    from parplan.solver.errors import ConfigError
    from parplan.solver.frontends.presets import get_preset

    with pytest.raises(ConfigError, match="Qwen"):
        check_supported(get_preset("qwen3-32b"))

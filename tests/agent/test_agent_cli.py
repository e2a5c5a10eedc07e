"""``parplan validate``: launches the ranks itself and prints measured vs predicted per rank."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parplan.cli import main

TINY_GPT2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 128, "n_head": 4, "vocab_size": 512, "n_positions": 64}


@pytest.fixture
def tiny_config(tmp_path: Path) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY_GPT2))
    return str(path)


@pytest.mark.slow
def test_validate_json_reports_every_rank(tiny_config: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["validate", "--model", tiny_config, "--gpus", "2", "--tp", "2", "--pp", "1", "--recompute", "none",
                 "--steps", "1", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    assert doc["config"]["model"]["layers"] == 2 and doc["shrunk_from"] is None
    assert [r["rank"] for r in doc["ranks"]] == [0, 1]
    for r in doc["ranks"]:
        for side in ("measured", "predicted"):
            assert r[side]["peak_bytes"] > 0
            for cat in ("parameters", "gradients", "optimizer_states", "activations", "temporary"):
                assert cat in r[side]["breakdown"]
        assert r["measured"]["breakdown"]["parameters"] == r["predicted"]["breakdown"]["parameters"]
        assert r["check"]["ok"]
    assert 0 <= doc["max_relative_error"] < 0.5
    assert doc["correct"] is True


@pytest.mark.slow
def test_validate_table_for_a_pipeline(tiny_config: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["validate", "--model", tiny_config, "--gpus", "2", "--tp", "1", "--pp", "2", "--global-batch", "4",
                 "--schedule", "gpipe", "--recompute", "full", "--steps", "1"])
    out = capsys.readouterr().out
    assert code == 0
    assert "tp1 pp2 dp1 zero0 recompute=full mb1x4 gpipe" in out
    assert "correctness vs single process: match" in out
    assert len([line for line in out.splitlines() if line.strip().startswith(("0     0", "1     1"))]) == 2


def test_validate_rejects_what_it_cannot_run(tiny_config: str, capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    assert main(["validate", "--model", tiny_config, "--gpus", "3", "--tp", "3", "--pp", "1"]) == 2
    assert "tp=3 does not divide heads" in capsys.readouterr().err
    assert main(["validate", "--model", "bert-large", "--gpus", "1", "--tp", "1", "--pp", "1"]) == 2
    assert "gpt and llama" in capsys.readouterr().err
    assert main(["validate", "--model", tiny_config, "--gpus", "4", "--tp", "2", "--pp", "1", "--zero", "1"]) == 2
    assert "zero=1 with tp > 1" in capsys.readouterr().err


def test_agent_and_validate_are_registered(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["agent", "--help"])
    assert e.value.code == 0
    assert "--server" in capsys.readouterr().out


def test_more_ranks_than_gpus_is_refused_unless_sharing_is_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """NCCL runs one rank per GPU; sharing GPUs through gloo measures gloo's buffers, not a real run's,
    so it is refused unless asked for (no process is started either way here)."""
    import torch

    from parplan.agent.launch import SHARE_GPUS_ENV, LaunchError, launch_function

    monkeypatch.delenv(SHARE_GPUS_ENV, raising=False)
    with pytest.raises(LaunchError, match=SHARE_GPUS_ENV):
        launch_function(print, (), torch.cuda.device_count() + 1, "cuda")

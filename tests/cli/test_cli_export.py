"""``parplan plan --target T --export DIR`` and ``parplan export PLAN.json --target T``, bad input included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parplan.cli import main

PLAN = ["plan", "--model", "llama-2-13b", "--gpus", "8", "--gpu", "A100-40GB", "--global-batch", "16",
        "--objective", "max-throughput"]


def run_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(list(args)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    return err


def test_plan_with_a_target_writes_its_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*PLAN, "--target", "megatron", "--export", str(tmp_path / "out"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["target"]["name"] == "megatron" and doc["solver"]["method"] in ("uniform", "baseline:megatron")
    args = (tmp_path / "out" / "megatron_args.txt").read_text()
    assert f"--tensor-model-parallel-size {doc['strategy']['tp']}\n" in args
    assert f"--global-batch-size {doc['strategy']['global_batch']}\n" in args
    (tmp_path / "plan.json").write_text(json.dumps(doc))
    assert main(["export", str(tmp_path / "plan.json"), "--target", "megatron", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["files"]["megatron_args.txt"] == args and again["version"] == "core_v0.16.1"


def test_export_refuses_what_the_trainer_cannot_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*PLAN, "--target", "megatron", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["strategy"]["tp"] > 1
    (tmp_path / "plan.json").write_text(json.dumps(doc))
    err = run_error(capsys, "export", str(tmp_path / "plan.json"), "--target", "deepspeed")
    assert "deepspeed cannot express this plan" in err and "tensor parallelism" in err


def test_bad_export_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "cannot read" in run_error(capsys, "export", str(tmp_path / "missing.json"), "--target", "megatron")
    (tmp_path / "bad.json").write_text("{not json")
    assert "is not JSON" in run_error(capsys, "export", str(tmp_path / "bad.json"), "--target", "megatron")
    (tmp_path / "list.json").write_text("[1, 2]")
    assert "plan document" in run_error(capsys, "export", str(tmp_path / "list.json"), "--target", "megatron")
    (tmp_path / "empty.json").write_text("{}")
    assert "no strategy" in run_error(capsys, "export", str(tmp_path / "empty.json"), "--target", "deepspeed")
    assert "--export needs --target" in run_error(capsys, *PLAN, "--export", str(tmp_path / "x"))
    with pytest.raises(SystemExit) as info:
        main(["export", str(tmp_path / "bad.json"), "--target", "nemo"])
    assert info.value.code == 2

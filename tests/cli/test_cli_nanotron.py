"""``parplan memory --from nanotron-config FILE``: nanotron's YAML priced with its runtime; a config
nanotron itself would refuse (sizes that do not agree, an option its strict loader does not know) is
one line on stderr and exit status 2."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from parplan.cli import main
from tests.exports.test_nanotron_export import CONFIG


def run_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(list(args)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def _write(tmp_path: Path, cfg: Any) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(cfg if isinstance(cfg, str) else yaml.safe_dump(cfg))
    return str(path)


def test_a_nanotron_config_is_priced_with_its_runtime(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, CONFIG)
    assert main(["memory", "--from", "nanotron-config", path, "--gpu", "H100-80GB", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["strategy"]["summary"].startswith("tp2 pp2 dp2 zero1 sp recompute=full mb2x4 gpipe")
    assert doc["strategy"]["runtime"] == "nanotron" and doc["cluster"]["gpus"] == 8
    assert (doc["import"]["kind"], doc["import"]["target"], doc["import"]["ignored"]) == (
        "nanotron-config", "nanotron", ["general"])


def _changed(section: str, key: str, value: Any) -> dict[str, Any]:
    cfg = copy.deepcopy(CONFIG)
    part = cfg["model"]["model_config"] if section == "model_config" else cfg[section]
    part[key] = value
    return cfg


@pytest.mark.parametrize(("cfg", "why"), [
    (_changed("parallelism", "dp", 4), "dp x tp x pp = 4 x 2 x 2 = 16 is not the 8 GPUs"),
    (_changed("model_config", "hidden_size", 250), "hidden_size 250 is not divisible by num_attention_heads 8"),
    (_changed("model_config", "num_key_value_heads", 3), "not divisible by num_key_value_heads 3"),
    (_changed("parallelism", "recompute_granularity", "selective"),
     "unknown option parallelism.recompute_granularity"),
    (_changed("parallelism", "pp_engine", "interleaved"), "parallelism.pp_engine 'interleaved'"),
    (_changed("optimizer", "zero_stage", 3), "optimizer.zero_stage 3 (nanotron has 0 and 1)"),
    ({**CONFIG, "trainer": {}}, "unknown section 'trainer'"),
    ("parallelism: [1, 2", "not YAML"),
    ("- a list", "expected a YAML mapping"),
])
def test_a_config_nanotron_would_refuse_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], cfg: Any,
                                                    why: str) -> None:
    err = run_error(capsys, "memory", "--from", "nanotron-config", _write(tmp_path, cfg), "--gpus", "8")
    assert why in err, err

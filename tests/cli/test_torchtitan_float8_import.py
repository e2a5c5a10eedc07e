"""torchtitan jobs with torchao Float8 linear layers, read as the precisions parplan prices them with.

Oracles: torchtitan's code. v0.2.2 torchtitan/components/quantization/float8.py (``Float8LinearConverter``):
no ``recipe_name`` is the tensorwise config, ``enable_fsdp_float8_all_gather`` applies only with
``parallel_dims.dp_shard_enabled``, and a recipe with the float8 all-gather is an assertion error;
torchtitan/config/job_config.py ``Float8Linear``: recipes tensorwise, rowwise, rowwise_with_gw_hp.
0.3.0 config_registry.py: ``llama3_debugmodel_float8()`` is ``Float8LinearConverter.Config()`` (rowwise).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from parplan.cli import main
from parplan.imports import ImportProblemError, LayerImport, read_config

CORPUS = Path(__file__).parents[1] / "data" / "real_configs" / "torchtitan"
#: torchtitan v0.2.2's own 405B file without its torch.compile and async tensor parallelism (not modelled)
EAGER_405B = (CORPUS / "v0.2.2_llama3_405b.toml").read_text().replace("enable=true", "enable=false").replace(
    "enable_async_tensor_parallel = true", "enable_async_tensor_parallel = false")


def _precision(text: str, gpus: int = 128) -> str:
    imported = read_config("torchtitan-config", text, gpus=gpus)
    assert not isinstance(imported, LayerImport)
    return imported.strategy.precision


@pytest.mark.parametrize(("edit", "precision"), [
    ("", "fp8-torchao-fsdp8"),  # tensorwise (no recipe_name) with FSDP2's float8 all-gather
    ("enable_fsdp_float8_all_gather = true", "fp8-torchao"),  # edited to false below
    ("recipe", "fp8-torchao-rowwise"),
], ids=["fsdp8", "tensorwise", "rowwise"])
def test_the_405b_file_float8_settings(edit: str, precision: str) -> None:
    text = EAGER_405B
    if edit == "enable_fsdp_float8_all_gather = true":
        text = text.replace(edit, "enable_fsdp_float8_all_gather = false")
    elif edit == "recipe":
        text = text.replace("enable_fsdp_float8_all_gather = true", 'recipe_name = "rowwise"')
    assert _precision(text) == precision


def test_the_float8_all_gather_needs_fsdp_sharding() -> None:
    # 128 GPUs as TP 8 x replicate 16: data_parallel_shard_degree 1, dp_shard_enabled is false
    text = EAGER_405B.replace("data_parallel_replicate_degree = 1", "data_parallel_replicate_degree = 16").replace(
        "data_parallel_shard_degree = -1", "data_parallel_shard_degree = 1")
    assert _precision(text) == "fp8-torchao"


@pytest.mark.parametrize(("edit", "named"), [
    ('recipe_name = "rowwise_with_gw_hp"', "rowwise_with_gw_hp"),
    ('recipe_name = "rowwise"\nenable_fsdp_float8_all_gather = true', "torchtitan refuses it"),
    ('filter_fqns = ["output", "attention.wk"]', "attention.wk"),
    ("emulate = true", "emulate"),
], ids=["gw-hp", "rowwise-gather", "filtered", "emulate"])
def test_float8_settings_not_modelled_are_refused(edit: str, named: str) -> None:
    text = EAGER_405B.replace('enable_fsdp_float8_all_gather = true\n', "").replace(
        'filter_fqns = ["output"]', edit if "filter" in edit else 'filter_fqns = ["output"]\n' + edit)
    with pytest.raises(ImportProblemError) as e:
        read_config("torchtitan-config", text, gpus=128)
    assert named in str(e.value)


def _memory(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["memory", *args, "--gpu", "H100-80GB", "--json"]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def test_priced_as_parplan_memory_prices_the_same_strategy(capsys: pytest.CaptureFixture[str],
                                                            tmp_path: Path) -> None:
    (tmp_path / "405b.toml").write_text(EAGER_405B)
    doc = _memory(capsys, "--from", "torchtitan-config", str(tmp_path / "405b.toml"), "--gpus", "128")
    # local 2, seq 8192, tp 8, shard -1 = 16, full checkpointing (the file's settings)
    by_hand = _memory(capsys, "--model", "llama-3-405b", "--gpus", "128", "--tp", "8", "--pp", "1", "--zero", "3",
                      "--sequence-parallel", "--recompute", "full", "--micro-batch", "2", "--global-batch", "32",
                      "--seq-len", "8192", "--runtime", "torchtitan", "--precision", "fp8-torchao-fsdp8")
    assert doc["strategy"]["summary"] == by_hand["strategy"]["summary"]
    assert doc["memory"] == by_hand["memory"]
    assert any("precision fp8-torchao-fsdp8" in a for a in doc["import"]["adjusted"])


def test_the_recipes_and_the_exported_config_functions() -> None:
    assert _precision("--module llama3 --config llama3_debugmodel_float8", gpus=8) == "fp8-torchao-rowwise"
    line = "--module parplan_torchtitan_config --config llama3_8b_float8_rowwise"
    assert _precision(line, gpus=8) == "fp8-torchao-rowwise"

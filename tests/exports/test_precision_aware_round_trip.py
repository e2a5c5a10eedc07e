"""Megatron-LM's precision-aware optimizer through the export and back through the import:
``--use-precision-aware-optimizer`` (with ``--exp-avg-dtype``/``--exp-avg-sq-dtype bf16``) read by
megatron-core's own ``OptimizerConfig``, whose ``store_param_remainders`` is true, and by parplan's importer
as the ``*-remainders`` precisions; what Megatron-LM refuses or parplan does not price is one line."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
from plan_docs import doc_for

from parplan.cli import main
from parplan.exports import NotExpressibleError, export_plan
from parplan.exports.megatron import OPTIMIZER_FLAGS
from parplan.imports import read_config
from parplan.imports.common import Imported, ImportProblemError

STRATEGY = {"tp": 2, "pp": 1, "dp": 4, "zero": 1, "sequence_parallel": True, "num_microbatches": 4}
BASE = ("--num-layers 2 --hidden-size 1024 --num-attention-heads 8 --seq-length 1024 --max-position-embeddings 1024 "
        "--micro-batch-size 1 --vocab-size 32000 --tensor-model-parallel-size 2 --use-distributed-optimizer ")


def _megatron_optimizer_config(args: str) -> Any:
    """megatron-core's OptimizerConfig from the exported optimizer flags, each dtype mapped as
    megatron/training/arguments.py maps it (fp32, bf16, fp16, fp8 -> torch dtypes)."""
    import torch
    from megatron.core.optimizer import OptimizerConfig

    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.uint8}
    kw: dict[str, Any] = {}
    for line in args.splitlines():
        flag, _, value = line.partition(" ")
        if flag in OPTIMIZER_FLAGS:
            kw[flag[2:].replace("-", "_")] = dtypes[value] if value else True
    return OptimizerConfig(**kw, bf16="--bf16" in args.split(), use_distributed_optimizer=True)


@pytest.mark.parametrize("precision", ["bf16-remainders", "bf16-grad16-remainders-moments-bf16",
                                       "fp8-remainders-moments-bf16"])
def test_the_precision_reads_back_from_the_exported_flags(precision: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("megatron.core", reason="the exports extra (megatron-core) is not installed")
    import torch
    from megatron.core.optimizer import optimizer_config

    # Transformer Engine is not installed here: megatron-core's checks answered as TE 2.1 would (its version,
    # and FusedAdam's signature with the keywords the precision-aware optimizer passes)
    monkeypatch.setattr(optimizer_config, "is_te_min_version", lambda version: True)
    te = types.ModuleType("transformer_engine.pytorch.optimizers")

    class FusedAdam:
        def __init__(self, master_weight_dtype: Any = None, exp_avg_dtype: Any = None, exp_avg_sq_dtype: Any = None,
                     use_decoupled_grad: Any = None, store_param_remainders: bool = False) -> None: ...

    te.FusedAdam = FusedAdam  # type: ignore[attr-defined]
    for name in ("transformer_engine", "transformer_engine.pytorch"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, te.__name__, te)
    exported = export_plan(doc_for("llama-3-8b", 8, STRATEGY | {"precision": precision}), "megatron")
    args = exported.files["megatron_args.txt"]
    cfg = _megatron_optimizer_config(args)
    moments = torch.bfloat16 if "moments-bf16" in precision else torch.float32
    assert cfg.use_precision_aware_optimizer and cfg.store_param_remainders
    assert (cfg.exp_avg_dtype, cfg.exp_avg_sq_dtype, cfg.main_params_dtype) == (moments, moments, torch.float32)
    imported = read_config("megatron-args", exported.files["launch_megatron.sh"], gpus=8)
    assert isinstance(imported, Imported)
    assert imported.strategy.precision == precision
    assert "--use-precision-aware-optimizer" not in imported.ignored and not imported.unknown, imported.report()


def test_what_megatron_cannot_write_is_refused_by_the_export() -> None:
    """Megatron-LM has no flag for store_param_remainders (true): bf16 moments beside an fp32 master cannot be
    written; nor the precision-aware optimizer without the distributed optimizer."""
    with pytest.raises(NotExpressibleError, match="store_param_remainders"):
        export_plan(doc_for("llama-3-8b", 8, STRATEGY | {"precision": "bf16-moments-bf16"}), "megatron")
    with pytest.raises(NotExpressibleError, match="needs the distributed optimizer"):
        export_plan(doc_for("llama-3-8b", 8, STRATEGY | {"zero": 0, "precision": "bf16-remainders"}), "megatron")


@pytest.mark.parametrize(("flags", "precision"), [
    ("--bf16 --use-precision-aware-optimizer", "bf16-remainders"),
    ("--bf16 --use-precision-aware-optimizer --main-grads-dtype bf16", "bf16-grad16-remainders"),
    ("--bf16 --use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16",
     "bf16-remainders-moments-bf16"),
    ("--fp16 --use-precision-aware-optimizer", "fp16-grad16"),  # TE: remainders for bf16 weights only
    ("--bf16 --fp8-format hybrid --fp8-recipe tensorwise --use-precision-aware-optimizer", "fp8-cs"),
])
def test_the_importer_reads_the_optimizers_states(flags: str, precision: str) -> None:
    imported = read_config("megatron-args", BASE + flags, gpus=8)
    assert isinstance(imported, Imported) and imported.strategy.precision == precision, imported.report()


@pytest.mark.parametrize(("flags", "words"), [
    ("--bf16 --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16", "without --use-precision-aware-optimizer"),
    ("--bf16 --use-precision-aware-optimizer --exp-avg-dtype bf16", "both fp32 or both bf16"),
    ("--bf16 --use-precision-aware-optimizer --exp-avg-dtype fp8 --exp-avg-sq-dtype fp8", "both fp32 or both bf16"),
    ("--bf16 --use-precision-aware-optimizer --main-params-dtype fp16", "--main-params-dtype fp16"),
    ("--fp16 --use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16", "not modelled"),
    ("--bf16 --fp8-format hybrid --fp8-param-gather --use-precision-aware-optimizer", "--fp8-param-gather"),
])
def test_what_is_not_priced_is_one_problem(flags: str, words: str) -> None:
    with pytest.raises(ImportProblemError, match=words) as e:
        read_config("megatron-args", BASE + flags, gpus=8)
    assert len(e.value.problems) == 1, e.value.problems


def test_the_distributed_optimizer_is_needed(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "args.txt"
    path.write_text(BASE.replace("--use-distributed-optimizer ", "") + "--bf16 --use-precision-aware-optimizer")
    rc = main(["memory", "--from", "megatron-args", str(path), "--gpus", "8", "--gpu", "H100-80GB"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "needs --use-distributed-optimizer" in err
    assert "Traceback" not in err

"""Galvatron exports, read back by an independent reader of Galvatron 2.4.0's strategy file.

The reader follows Galvatron 2.4.0's loader (``galvatron/utils/config_utils.py: config2strategy``,
``galvatron/core/runtime/hybrid_parallel_config.py: get_hybrid_parallel_configs_api``): per-block
comma-separated lists, dp type 0 = ``default_dp_type`` and 1 = ZeRO-3, data-parallel degree
``gpus / pp_deg / tp``, stages from ``pp_division``. Galvatron's own loader cannot be imported
here (its package imports Megatron, flash-attn and CUDA extensions); with ``HETU_GALVATRON_SRC``
pointing at an unpacked ``hetu-galvatron==2.4.0`` source tree, one more test runs its loader and
checks (``get_hybrid_parallel_configs_api``, ``check_hp_config``, ``hp_config_whole_model``) on
the exported files with stand-ins for the modules that need CUDA.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from parplan.exports import NotExpressibleError
from parplan.exports.galvatron import CONFIG_FILE, GALVATRON_VERSION, SCRIPT_FILE, export_galvatron
from parplan.solver.frontends.presets import get_preset

KEYS = ["pp_deg", "tp_sizes_enc", "tp_consecutive_flags", "dp_types_enc", "use_sp", "checkpoint", "global_bsz",
        "chunks", "pp_division", "pipeline_type", "default_dp_type", "vtp", "vsp", "embed_sdp"]


def run(first: int, count: int, tp: int, dp: int, zero: int = 0, sp: bool = False, recompute: str = "selective",
        tp_inner: bool = True, stage: int = 0, ep: int = 1) -> dict[str, Any]:
    return {"first": f"layers.{first}", "last": f"layers.{first + count - 1}", "count": count,
            "strategy": f"tp{tp} dp{dp} zero{zero}", "stage": stage, "tp": tp, "dp": dp, "zero": zero,
            "sequence_parallel": sp, "recompute": recompute, "tp_inner": tp_inner, "expert_parallel": ep}


def layer_doc(runs: list[dict[str, Any]], *, preset: str = "gpt-1.7b", gpus: int = 16, per_node: int = 8,
              pp: int = 1, m: int = 1, global_batch: int = 64, partition: list[int] | None = None,
              **strategy: Any) -> dict[str, Any]:
    arch = dataclasses.asdict(get_preset(preset))
    s = {"kind": "per-layer", "summary": "test", "pp": pp, "num_microbatches": m, "global_batch": global_batch,
         "partition": partition if partition is not None else [sum(r["count"] for r in runs)],
         "schedule": "1f1b", "precision": "bf16", "flash_attention": True, "layers": runs} | strategy
    return {"model": {"name": preset, "seq_len": arch["seq_len"], "architecture": arch},
            "cluster": {"gpus": gpus, "gpus_per_node": per_node, "gpu": "A100-40GB"}, "strategy": s}


def uniform_doc(preset: str, gpus: int, per_node: int = 8, **strategy: Any) -> dict[str, Any]:
    arch = dataclasses.asdict(get_preset(preset))
    s = {"kind": "uniform", "tp": 1, "pp": 1, "dp": gpus, "zero": 0, "sequence_parallel": False,
         "recompute": "selective", "micro_batch": 1, "num_microbatches": 1, "schedule": "1f1b", "virtual_stages": 1,
         "precision": "bf16", "flash_attention": True, "expert_parallel": 1, "summary": "test"} | strategy
    s.setdefault("global_batch", s["micro_batch"] * s["num_microbatches"] * s["dp"])
    return {"model": {"name": preset, "seq_len": arch["seq_len"], "architecture": arch},
            "cluster": {"gpus": gpus, "gpus_per_node": min(gpus, per_node)}, "strategy": s}


#: The brief's example: a DP plan whose first block differs from the rest.
EXAMPLE = layer_doc([run(0, 1, 4, 4, zero=2, sp=True), run(1, 23, 2, 8, zero=3, sp=True)])


# --- the independent reader -----------------------------------------------------------------------

def ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


def decode(config: dict[str, Any], gpus: int) -> list[dict[str, Any]]:
    """Every block's strategy as Galvatron 2.4.0 runs the file on ``gpus`` devices."""
    pp = int(config["pp_deg"])
    tps = ints(config["tp_sizes_enc"])
    consec = ints(config["tp_consecutive_flags"])
    dp_types = ints(config["dp_types_enc"])
    use_sp = ints(config["use_sp"]) if "use_sp" in config else [0] * len(tps)
    ckpt = ints(config["checkpoint"]) if "checkpoint" in config else [0] * len(tps)
    division = ints(config["pp_division"])
    assert len(division) == pp and sum(division) == len(tps)
    stages = [s for s, count in enumerate(division) for _ in range(count)]
    assert len({len(tps), len(consec), len(dp_types), len(use_sp), len(ckpt)}) == 1
    default = {"ddp": 0, "zero2": 2, "zero3": 3}[config["default_dp_type"]]
    out = []
    for tp, c, d, u, k, stage in zip(tps, consec, dp_types, use_sp, ckpt, stages, strict=True):
        assert u == 0  # Ulysses sequence parallelism (in place of TP) is never written
        assert (gpus // pp) % tp == 0 and c in (0, 1) and d in (0, 1) and k in (0, 1)
        dp = gpus // pp // tp
        out.append({"tp": tp, "dp": dp, "zero": 3 if d else default, "tp_inner": bool(c) or tp in (1, gpus // pp),
                    "full_recompute": bool(k), "stage": stage})
    return out


def expected(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The plan's per-block strategies in the reader's terms (ZeRO and order matter only with dp > 1)."""
    s = doc["strategy"]
    stages = [st for st, count in enumerate(s["partition"]) for _ in range(count)]
    blocks = [r for r in s["layers"] for _ in range(r["count"])]
    return [{"tp": r["tp"], "dp": r["dp"], "zero": r["zero"], "tp_inner": r["tp_inner"] or r["tp"] == 1 or r["dp"] == 1,
             "full_recompute": r["recompute"] == "full", "stage": st} for r, st in zip(blocks, stages, strict=True)]


def normal(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [b | {"zero": b["zero"] if b["dp"] > 1 else None} for b in blocks]


def config_of(doc: dict[str, Any]) -> dict[str, Any]:
    out = export_galvatron(doc)
    config: dict[str, Any] = json.loads(out.files[CONFIG_FILE])
    return config


# --- what the file says ---------------------------------------------------------------------------

def test_example_per_layer_lists() -> None:
    out = export_galvatron(EXAMPLE)
    assert out.target == "galvatron" and out.version == GALVATRON_VERSION == "2.4.0"
    config = json.loads(out.files[CONFIG_FILE])
    assert list(config) == KEYS
    assert ints(config["tp_sizes_enc"]) == [4] + [2] * 23
    assert ints(config["dp_types_enc"]) == [0] + [1] * 23
    assert ints(config["tp_consecutive_flags"]) == [1] * 24
    assert ints(config["use_sp"]) == [0] * 24
    assert ints(config["checkpoint"]) == [0] * 24
    assert config["default_dp_type"] == "zero2"  # the one block that is not ZeRO-3 uses ZeRO-2
    assert config["pp_deg"] == 1 and config["pp_division"] == "24"
    assert config["global_bsz"] == 64 and config["chunks"] == 1
    assert config["pipeline_type"] == "pipedream_flush"
    # the embedding (first block: tp4 zero2) and head (last: tp2 sdp) share one strategy in Galvatron
    assert config["vtp"] == 4 and config["vsp"] == 0 and config["embed_sdp"] == 1
    vocab = [n for n in out.notes if "embedding and the output head" in n]
    assert len(vocab) == 1 and "tp 4, sharded" in vocab[0]
    assert "embedding (planned like the first block, tp4 dp4 zero2)" in vocab[0]
    assert "output head (planned like the last block, tp2 dp8 sdp)" in vocab[0]
    assert normal(decode(config, 16)) == normal(expected(EXAMPLE))


def test_example_launch() -> None:
    out = export_galvatron(EXAMPLE)
    assert len(out.launch) == 2  # 16 GPUs, 8 per node
    for node, line in enumerate(out.launch):
        assert "--nnodes 2 --nproc_per_node 8" in line and f"--node_rank {node}" in line
        assert "galvatron/models/gpt_hf" in line and "train_dist.py" in line
        assert "--sequence-parallel" in line and "--use-flash-attn" in line and "--mixed_precision bf16" in line
        assert "--galvatron_config_path" in line and "--reduce_in_fp32" in line
        assert "--global_train_batch_size 64" in line and "--chunks 1" in line
        assert "--hidden_size 2304" in line and "--num_hidden_layers 24" in line
    script = out.files[SCRIPT_FILE]
    assert script.startswith("#!/usr/bin/env bash") and CONFIG_FILE in script and "--sequence-parallel" in script
    bash = shutil.which("bash")
    if bash:
        assert subprocess.run([bash, "-n"], input=script, text=True, check=False).returncode == 0


def test_pipeline_stages_order_and_checkpointing() -> None:
    runs = [run(0, 2, 1, 8, zero=0, stage=0), run(2, 4, 2, 4, zero=0, sp=True, tp_inner=False, stage=0),
            run(6, 6, 4, 2, zero=3, sp=True, recompute="full", stage=1),
            run(12, 12, 4, 2, zero=3, sp=True, recompute="full", tp_inner=False, stage=1)]
    doc = layer_doc(runs, pp=2, m=4, global_batch=64, partition=[6, 18], schedule="gpipe")
    out = export_galvatron(doc)
    config = json.loads(out.files[CONFIG_FILE])
    vocab = [n for n in out.notes if "embedding and the output head" in n]
    assert len(vocab) == 1 and "embedding (planned like the first block, tp1 dp8)" in vocab[0]
    assert "output head (planned" not in vocab[0]  # the last block is tp4 sdp, as Galvatron runs the head
    assert config["pp_deg"] == 2 and ints(config["pp_division"]) == [6, 18]
    assert sum(ints(config["pp_division"])) == 24
    assert config["chunks"] == 4 and config["global_bsz"] == 64 and config["pipeline_type"] == "gpipe"
    assert ints(config["tp_sizes_enc"]) == [1] * 2 + [2] * 4 + [4] * 18
    assert ints(config["tp_consecutive_flags"]) == [1] * 2 + [0] * 4 + [1] * 6 + [0] * 12
    assert ints(config["dp_types_enc"]) == [0] * 6 + [1] * 18
    assert ints(config["checkpoint"]) == [0] * 6 + [1] * 18
    assert config["default_dp_type"] == "ddp"
    assert config["vtp"] == 4 and config["embed_sdp"] == 1  # the larger of the two vocabulary neighbours' TP
    decoded = decode(config, 16)
    assert [b["stage"] for b in decoded] == [0] * 6 + [1] * 18
    assert normal(decoded) == normal(expected(doc))


def test_stages_from_runs_when_no_partition() -> None:
    runs = [run(0, 10, 2, 4, stage=0), run(10, 14, 2, 4, stage=1)]
    doc = layer_doc(runs, pp=2, m=2, global_batch=16, partition=[])
    assert ints(config_of(doc)["pp_division"]) == [10, 14]


def test_same_embedding_and_head_strategy_has_no_note() -> None:
    doc = layer_doc([run(0, 24, 2, 8, zero=2, sp=True)])
    out = export_galvatron(doc)
    config = json.loads(out.files[CONFIG_FILE])
    assert config["vtp"] == 2 and config["embed_sdp"] == 0 and config["default_dp_type"] == "zero2"
    assert not any("embedding and the output head" in n for n in out.notes)


def test_uniform_llama_uses_galvatron_preset() -> None:
    doc = uniform_doc("llama-2-7b", 32, tp=4, pp=2, dp=4, zero=3, sequence_parallel=True, recompute="full",
                      micro_batch=2, num_microbatches=8)
    out = export_galvatron(doc)
    config = json.loads(out.files[CONFIG_FILE])
    assert ints(config["tp_sizes_enc"]) == [4] * 32 and ints(config["dp_types_enc"]) == [1] * 32
    assert ints(config["checkpoint"]) == [1] * 32
    assert ints(config["pp_division"]) == [16, 16] and config["global_bsz"] == 64 and config["chunks"] == 8
    assert all(b == {"tp": 4, "dp": 4, "zero": 3, "tp_inner": True, "full_recompute": True, "stage": b["stage"]}
               for b in decode(config, 32))
    line = out.launch[0]
    assert "galvatron/models/llama_hf" in line and "--model_size llama-7b" in line
    assert "--num_hidden_layers 32" in line and "--seq_length 4096" in line
    assert not any("differs from the planned one" in n for n in out.notes)


def test_uniform_t5_counts_encoder_and_decoder_blocks() -> None:
    doc = uniform_doc("t5-11b", 8, tp=2, dp=4, zero=2, sync_every_microbatch=True, precision="bf16-grad16")
    out = export_galvatron(doc)
    config = json.loads(out.files[CONFIG_FILE])
    assert len(ints(config["tp_sizes_enc"])) == 48 and ints(config["pp_division"]) == [48]
    assert config["default_dp_type"] == "zero2" and config["embed_sdp"] == 0
    line = out.launch[0]
    assert "galvatron/models/T5" in line and "--num_encoder_layers 24 --num_decoder_layers 24" in line
    assert "--no_async_grad_reduce" in line and "--reduce_in_fp32" not in line
    assert "--sequence-parallel" not in line
    # t5-11b's ffn (65536) and head size (128) are not what Galvatron's T5 arguments build
    assert any("differs from the planned one" in n and "65536" in n for n in out.notes)


def test_uniform_even_partition() -> None:
    doc = uniform_doc("gpt-1.7b", 16, tp=2, pp=4, dp=2, num_microbatches=4, schedule="gpipe")
    config = config_of(doc)
    assert config["pp_deg"] == 4 and ints(config["pp_division"]) == [6, 6, 6, 6]
    assert config["pipeline_type"] == "gpipe"


# --- what Galvatron cannot run --------------------------------------------------------------------

def reasons(doc: dict[str, Any]) -> list[str]:
    with pytest.raises(NotExpressibleError) as err:
        export_galvatron(doc)
    assert err.value.target == "galvatron"
    return list(err.value.reasons)


def test_intra_operator_plan() -> None:
    doc = layer_doc([run(0, 24, 2, 8)])
    doc["strategy"] = {"kind": "intra-operator", "summary": "per-op shardings"}
    assert "shards each operator" in reasons(doc)[0]


def test_zero1_and_mixed_dp_types() -> None:
    assert any("ZeRO-1" in r for r in reasons(layer_doc([run(0, 24, 2, 8, zero=1)])))
    mixed = layer_doc([run(0, 12, 2, 8, zero=0), run(12, 12, 2, 8, zero=2)])
    assert any("default_dp_type" in r for r in reasons(mixed))
    # ZeRO stages do not matter for blocks without data parallelism
    ok = layer_doc([run(0, 12, 16, 1, zero=1), run(12, 12, 2, 8, zero=0)], global_batch=64)
    assert ints(config_of(ok)["tp_sizes_enc"]) == [16] * 12 + [2] * 12


def test_expert_parallel_and_moe_model() -> None:
    doc = uniform_doc("mixtral-8x7b", 16, tp=2, dp=8, expert_parallel=4)
    found = reasons(doc)
    assert any("mixture-of-experts model" in r for r in found)
    assert any("expert parallelism" in r for r in found)


def test_context_parallelism() -> None:
    doc = uniform_doc("llama-3-8b", 16, tp=2, dp=2, cp=4)
    assert any("context parallelism (cp=4)" in r for r in reasons(doc))


def test_sequence_parallel_must_agree() -> None:
    doc = layer_doc([run(0, 12, 2, 8, sp=True), run(12, 12, 4, 4, sp=False)])
    assert any("--sequence-parallel" in r for r in reasons(doc))
    # a TP-1 block has no sequence parallelism to disagree about
    ok = layer_doc([run(0, 12, 1, 16, sp=False), run(12, 12, 4, 4, sp=True)])
    assert "--sequence-parallel" in export_galvatron(ok).launch[0]


def test_interleaved_schedule() -> None:
    doc = uniform_doc("gpt-1.7b", 16, tp=2, pp=2, dp=4, num_microbatches=4, schedule="interleaved",
                      virtual_stages=2)
    assert any("interleaved" in r for r in reasons(doc))


def test_selective_recompute_needs_flash_attention() -> None:
    doc = layer_doc([run(0, 24, 2, 8, recompute="selective")], flash_attention=False)
    assert any("selective recomputation" in r for r in reasons(doc))
    ok = layer_doc([run(0, 24, 2, 8, recompute="none")], flash_attention=False)
    assert "--use-flash-attn" not in export_galvatron(ok).launch[0]


def test_graph_without_architecture() -> None:
    doc = layer_doc([run(0, 24, 2, 8)])
    del doc["model"]["architecture"]
    assert any("without an architecture" in r for r in reasons(doc))


def test_wrong_shapes() -> None:
    assert any("cover 20 blocks" in r for r in reasons(layer_doc([run(0, 20, 2, 8)], partition=[20])))
    assert any("tp 2 x dp 4" in r for r in reasons(layer_doc([run(0, 24, 2, 4)])))
    bad_part = layer_doc([run(0, 12, 2, 4, stage=0), run(12, 12, 2, 4, stage=1)], pp=2, m=2, global_batch=16,
                         partition=[10, 14])
    assert any("says stage" in r for r in reasons(bad_part))


def test_every_reason_is_listed() -> None:
    doc = layer_doc([run(0, 12, 2, 8, zero=1, sp=True, ep=2), run(12, 12, 4, 4, zero=0, sp=False)],
                    precision="fp8", flash_attention=False)
    found = reasons(doc)
    for part in ("ZeRO-1", "expert parallelism", "--sequence-parallel", "selective recomputation", "fp8"):
        assert any(part in r for r in found), part


def test_no_cluster() -> None:
    doc = layer_doc([run(0, 24, 2, 8)])
    del doc["cluster"]
    assert reasons(doc)


# --- Galvatron's own loader (needs its source: HETU_GALVATRON_SRC) --------------------------------

@pytest.fixture
def galvatron_loader(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[dict[str, Any], int, list[int]], Any]]:
    """Galvatron 2.4.0's loader functions, with stand-ins for the package modules that need CUDA."""
    src = os.environ.get("HETU_GALVATRON_SRC")
    if not src:
        pytest.skip("set HETU_GALVATRON_SRC to an unpacked hetu-galvatron 2.4.0 source tree to run its loader")
    torch = pytest.importorskip("torch")
    pytest.importorskip("numpy")
    root = Path(src) / "galvatron"
    before = set(sys.modules)
    pkg, utils, core = (types.ModuleType(n) for n in ("galvatron", "galvatron.utils", "galvatron.core"))
    pkg.__path__ = [str(root)]
    utils.__path__ = [str(root / "utils")]
    core.__path__ = []
    for name, module in (("galvatron", pkg), ("galvatron.utils", utils), ("galvatron.core", core)):
        monkeypatch.setitem(sys.modules, name, module)
    if importlib.util.find_spec("scipy") is None:  # config_utils imports curve_fit for profiling only
        scipy, optimize = types.ModuleType("scipy"), types.ModuleType("scipy.optimize")
        optimize.curve_fit = None  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "scipy", scipy)
        monkeypatch.setitem(sys.modules, "scipy.optimize", optimize)
    config_utils = importlib.import_module("galvatron.utils.config_utils")
    for name in ("config2strategy", "read_json_config", "str2array"):
        setattr(utils, name, getattr(config_utils, name))
    path = root / "core/runtime/hybrid_parallel_config.py"
    spec = importlib.util.spec_from_file_location("galvatron_hp_config", path)
    assert spec is not None and spec.loader is not None
    hpc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hpc)

    def load(config: dict[str, Any], gpus: int, layernums: list[int]) -> Any:
        args = types.SimpleNamespace(local_rank=-1, galvatron_config_path=config, chunks=-1, global_train_batch_size=1,
                                     pipeline_type="gpipe", default_dp_type="ddp", embed_sdp=0, vocab_tp=1,
                                     vocab_sp=0, distributed_checkpoint=False, mixed_precision="bf16", pp_deg=1)
        core.get_args = lambda: args  # type: ignore[attr-defined]
        monkeypatch.setattr(torch.distributed, "get_world_size", lambda *a, **k: gpus)
        info = hpc.ModelInfo()
        info.set_layernums(layernums)
        hp = hpc.get_hybrid_parallel_configs_api(None, args, lambda c, a: info)
        hpc.check_hp_config(hp, layernums)
        module_types = ["embed", *(["dec"] * sum(layernums)), "norm", "cls"]
        whole = hpc.hp_config_whole_model(module_types, hp, embed_sdp=args.embed_sdp, embed_ckpt=0,
                                          vocab_tp=args.vocab_tp, vocab_sp=args.vocab_sp)
        return args, hp, whole

    yield load
    patched = {"galvatron", "galvatron.utils", "galvatron.core", "scipy", "scipy.optimize"}
    for name in set(sys.modules) - before - patched:
        del sys.modules[name]


@pytest.mark.parametrize("case", ["example", "pipeline"])
def test_galvatron_own_loader(case: str, galvatron_loader: Callable[[dict[str, Any], int, list[int]], Any]) -> None:
    if case == "example":
        doc = EXAMPLE
    else:
        doc = layer_doc([run(0, 6, 2, 4, tp_inner=False, stage=0), run(6, 18, 4, 2, zero=3, recompute="full",
                                                                       stage=1)],
                        pp=2, m=4, global_batch=64, partition=[6, 18], schedule="gpipe")
    config = config_of(doc)
    args, hp, whole = galvatron_loader(config, 16, [24])
    assert args.global_train_batch_size == doc["strategy"]["global_batch"]
    assert args.chunks == doc["strategy"]["num_microbatches"] and args.pp_deg == doc["strategy"]["pp"]
    assert args.default_dp_type == config["default_dp_type"] and args.vocab_tp == config["vtp"]
    want = expected(doc)
    assert hp["pp_ranks_enc"] == [b["stage"] for b in want]
    blocks = slice(1, 25)
    assert whole["tp_sizes_whole"][blocks] == [b["tp"] for b in want]
    assert whole["sp_sizes_whole"][blocks] == [1] * 24
    assert whole["dp_sizes_whole"][blocks] == [b["dp"] for b in want]
    assert whole["checkpoint_flags_whole"][blocks] == [int(b["full_recompute"]) for b in want]
    zero_of = {0: {"ddp": 0, "zero2": 2}[args.default_dp_type], 1: 3}
    assert [zero_of[t] for t, b in zip(whole["dp_types_whole"][blocks], want, strict=True) if b["dp"] > 1] == \
        [b["zero"] for b in want if b["dp"] > 1]
    assert whole["tp_sizes_whole"][0] == whole["tp_sizes_whole"][-1] == config["vtp"]


def test_galvatron_own_loader_rejects_a_bad_file(
        galvatron_loader: Callable[[dict[str, Any], int, list[int]], Any]) -> None:
    config = config_of(EXAMPLE)
    config["tp_sizes_enc"] = ",".join(["3"] * 24)  # 3 does not divide the 16 devices of the stage
    with pytest.raises(AssertionError):
        galvatron_loader(config, 16, [24])


def test_export_plan_dispatches_here() -> None:
    from parplan.exports import export_plan

    assert export_plan(EXAMPLE, "galvatron").files == export_galvatron(EXAMPLE).files

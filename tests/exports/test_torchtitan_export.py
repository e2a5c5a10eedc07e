"""torchtitan exports, read back by torchtitan 0.3.0's own loader.

The argument file is parsed by torchtitan's ``ConfigManager`` (registry config + tyro overrides,
with the config classes' own validation); the parsed config must give back the plan's degrees,
batch sizes, sequence length, recomputation, schedule, stage split and the model's sizes. Its
degrees then go through torchtitan's ``ParallelDims`` (they must multiply to the world size; no
process group is made) and its model config through ``update_from_config`` (TP must divide the
heads, the sequence fit the RoPE table). The launch lines are read by torchrun's own parser.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from plan_docs import torchrun_namespace

from parplan.agent.torchtitan_exec import KERNELS, stand_in_kernels
from parplan.exports.common import Export, NotExpressibleError
from parplan.exports.torchtitan import ARGS_FILE, CONFIG_MODULE, SCRIPT_FILE, TORCHTITAN_VERSION, export_torchtitan
from parplan.solver.cost.pipeline import even_partition
from parplan.solver.frontends.presets import get_preset

pytest.importorskip("torchtitan.config.manager", reason="torchtitan is not installed")
if importlib.metadata.version("torchtitan") != TORCHTITAN_VERSION:
    pytest.skip(f"the export is pinned to torchtitan {TORCHTITAN_VERSION}", allow_module_level=True)

Loader = Callable[[list[str]], Any]


@pytest.fixture(scope="module")
def loader() -> Iterator[Loader]:
    """torchtitan's ``ConfigManager().parse_args``. With CPU-only torch (no Triton) the Triton kernels
    of torchtitan's expert-parallel dispatcher, imported with every model module and never run
    while a config is parsed, are stood in for by functions that raise."""
    added = stand_in_kernels()
    from torchtitan.config.manager import ConfigManager

    yield lambda args: ConfigManager().parse_args(list(args))
    if added:
        sys.modules.pop(KERNELS, None)


# --- plan documents, written by hand (no search runs) ------------------------------------------


def doc_for(preset: str, gpus: int, per_node: int = 8, **strategy: Any) -> dict[str, Any]:
    """A uniform plan document for ``preset`` on ``gpus`` GPUs."""
    arch = dataclasses.asdict(get_preset(preset))
    s: dict[str, Any] = {"kind": "uniform", "tp": 1, "pp": 1, "dp": gpus, "zero": 3, "sequence_parallel": False,
                         "recompute": "full", "micro_batch": 1, "num_microbatches": 1, "schedule": "1f1b",
                         "virtual_stages": 1, "precision": "bf16", "expert_parallel": 1,
                         "flash_attention": True, "runtime": "torchtitan"} | strategy
    s.setdefault("global_batch", s["micro_batch"] * s["num_microbatches"] * s["dp"])
    return {"model": {"name": preset, "seq_len": arch["seq_len"], "architecture": arch},
            "cluster": {"gpus": gpus, "gpus_per_node": min(gpus, per_node)}, "strategy": s}


def per_layer_doc(second: dict[str, Any]) -> dict[str, Any]:
    """A per-layer plan of llama-3-8b on 16 GPUs: two runs of 16 blocks, the second changed by ``second``."""
    run = {"first": "layers.0", "last": "layers.15", "count": 16, "strategy": "tp2 dp4 zero3 sp recompute=full",
           "stage": 0, "tp": 2, "dp": 4, "zero": 3, "sequence_parallel": True, "recompute": "full",
           "tp_inner": True, "expert_parallel": 1}
    other = run | {"first": "layers.16", "last": "layers.31", "stage": 1} | second
    doc = doc_for("llama-3-8b", 16)
    doc["strategy"] = {"kind": "per-layer", "summary": "pp2 x 8 micro-batches", "pp": 2, "num_microbatches": 8,
                       "global_batch": 32, "partition": [16, 16], "schedule": "1f1b", "layers": [run, other],
                       "precision": "bf16", "flash_attention": True}
    return doc


# --- reading an export back ------------------------------------------------------------------


def parse(export: Export, loader: Loader, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The export's files written to ``tmp_path``; its argument file parsed by torchtitan."""
    for name, text in export.files.items():
        (tmp_path / name).write_text(text)
    if CONFIG_MODULE + ".py" in export.files:  # what the launch script's PYTHONPATH does
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.delitem(sys.modules, CONFIG_MODULE, raising=False)
    return loader((tmp_path / ARGS_FILE).read_text().splitlines())


def check_config(config: Any, doc: dict[str, Any]) -> None:
    """The parsed torchtitan config runs ``doc``'s plan on ``doc``'s model and cluster."""
    from torch.distributed.pipelining.schedules import PipelineScheduleMulti, get_schedule_class
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    from torchtitan.models.common import Linear

    s, arch = doc["strategy"], doc["model"]["architecture"]
    p, t = config.parallelism, config.training
    gpus = doc["cluster"]["gpus"]
    tp, pp, dp = s["tp"], s["pp"], s["dp"]

    dims = ParallelDims.from_config(p, gpus)  # asserts the degrees multiply to the world size
    assert (dims.tp, dims.pp, dims.dp_replicate * dims.dp_shard, dims.cp, dims.ep) == (tp, pp, dp, 1, 1)
    if dp > 1 and s["zero"] >= 2:
        shard = s.get("dp_shard") or dp
        assert (dims.dp_shard, dims.dp_replicate) == (shard, dp // shard)
        assert p.fsdp_reshard_after_forward == ("always" if s["zero"] == 3 else "never")
    else:
        assert (dims.dp_shard, dims.dp_replicate) == (1, dp)
    assert p.enable_sequence_parallel is bool(s["sequence_parallel"])

    config.model_spec.model.update_from_config(config=config)  # TP | heads, kv heads; seq_len <= RoPE table
    model = config.model_spec.model
    attention = model.layers[0].attention
    assert len(model.layers) == arch["layers"]
    assert model.dim == arch["hidden"]
    assert (attention.n_heads, attention.n_kv_heads) == (arch["heads"], arch["kv_heads"])
    assert {b.feed_forward.w1.out_features for b in model.layers} == {arch["ffn"]}
    assert type(model.layers[0].feed_forward.w1) is Linear.Config  # plain linear layers (no Float8)
    assert model.vocab_size == arch["vocab"] == config.loss.loss_fn.global_vocab_size
    assert model.enable_weight_tying is False

    assert t.seq_len == doc["model"]["seq_len"]
    assert t.global_batch_size == s["global_batch"]
    accumulation = t.global_batch_size // (t.local_batch_size * dp)
    assert accumulation * t.local_batch_size * dp == s["global_batch"]
    pipelined = t.local_batch_size // p.pipeline_parallel_microbatch_size if pp > 1 else 1
    assert accumulation * pipelined == s["num_microbatches"]
    assert t.local_batch_size // pipelined == s["micro_batch"]
    assert (t.dtype, t.mixed_precision_param, t.mixed_precision_reduce) == ("float32", "bfloat16", "float32")
    assert t.disable_cuda_graphs and not config.compile.enable

    if s["recompute"] == "full":
        assert isinstance(config.activation_checkpoint, FullAC.Config)
    elif s["recompute"] == "op":
        assert type(config.activation_checkpoint) is SelectiveAC.Config
    else:
        assert config.activation_checkpoint is None

    assert p.pipeline_parallel_degree == pp
    if pp > 1:
        v = s.get("virtual_stages", 1) if s["schedule"] in ("interleaved", "interleaved-zb", "zbv", "dualpipev") else 1
        schedule = get_schedule_class(p.pipeline_parallel_schedule)
        assert schedule is get_schedule_class({"1f1b": "1F1B", "gpipe": "GPipe", "interleaved": "Interleaved1F1B",
                                               "interleaved-zb": "InterleavedZeroBubble",
                                               "zbv": "ZBVZeroBubble", "dualpipev": "DualPipeV"}[s["schedule"]])
        assert issubclass(schedule, PipelineScheduleMulti) is (v > 1)
        parts = p.module_fqns_per_model_part
        assert len(parts) == pp * v
        flat = [name for part in parts for name in part]
        assert flat == ["tok_embeddings", *(f"layers.{i}" for i in range(arch["layers"])), "norm", "lm_head"]
        blocks = [sum(n.startswith("layers.") for n in part) for part in parts]
        assert blocks == list(s.get("partition") or even_partition(arch["layers"], pp * v))


def check_launch(export: Export, doc: dict[str, Any]) -> None:
    """One torchrun line per node, the argument file's arguments after ``-m torchtitan.train``; the
    script runs the same command with NODE_RANK, extra options before the subcommand."""
    gpus, per_node = doc["cluster"]["gpus"], doc["cluster"]["gpus_per_node"]
    args = export.files[ARGS_FILE].splitlines()
    assert len(export.launch) == gpus // per_node
    for rank, line in enumerate(export.launch):
        ns = torchrun_namespace(line)
        assert (ns.nnodes, ns.nproc_per_node, ns.node_rank) == (str(gpus // per_node), str(per_node), rank)
        assert (ns.master_addr, ns.master_port) == ("10.0.0.1", 29500)
        assert ns.module and ns.training_script == "torchtitan.train"
        assert ns.training_script_args == args
    script = export.files[SCRIPT_FILE]
    assert script.startswith("#!/usr/bin/env bash\n") and f"torchtitan {TORCHTITAN_VERSION}" in script
    tokens = shlex.split(script.split("\nexec ", 1)[1].replace("\\\n", " "))  # bash joins continued lines
    assert tokens[:6] == ["torchrun", f"--nnodes={gpus // per_node}", f"--nproc-per-node={per_node}",
                          "--node-rank=$NODE_RANK", "--master-addr=$MASTER_ADDR", "--master-port=$MASTER_PORT"]
    assert tokens[6:8] == ["-m", "torchtitan.train"]
    assert tokens[8:] == [*args[:-1], "$@", args[-1]]
    if shutil.which("bash"):
        subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def export_and_check(doc: dict[str, Any], loader: Loader, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    export = export_torchtitan(doc)
    assert (export.target, export.version) == ("torchtitan", TORCHTITAN_VERSION)
    config = parse(export, loader, tmp_path, monkeypatch)
    check_config(config, doc)
    check_launch(export, doc)
    return export, config


# --- plans torchtitan runs -------------------------------------------------------------------


def test_uniform_plan(loader: Loader, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = doc_for("llama-3-8b", 16, tp=2, pp=2, dp=4, zero=3, sequence_parallel=True, recompute="full",
                  micro_batch=1, num_microbatches=8, global_batch=32)
    export, config = export_and_check(doc, loader, tmp_path, monkeypatch)
    assert (config.model_spec.name, config.model_spec.flavor) == ("llama3", "8B")
    assert (config.training.local_batch_size, config.parallelism.pipeline_parallel_microbatch_size) == (8, 1)
    assert config.parallelism.pipeline_parallel_schedule == "1F1B"
    assert set(export.files) == {ARGS_FILE, SCRIPT_FILE}


@pytest.mark.parametrize(("preset", "gpus", "strategy"), [
    ("llama-3-8b", 8, {"tp": 2, "dp": 4, "zero": 3, "sequence_parallel": True, "recompute": "selective",
                       "micro_batch": 2, "num_microbatches": 4}),
    ("llama-3-70b", 64, {"tp": 8, "pp": 4, "dp": 2, "zero": 2, "sequence_parallel": True, "num_microbatches": 8,
                         "schedule": "interleaved", "virtual_stages": 2}),
    ("llama-3-405b", 1024, {"tp": 8, "pp": 16, "dp": 8, "zero": 3, "sequence_parallel": True,
                            "num_microbatches": 32}),
], ids=["8b-8gpus", "70b-64gpus", "405b-1024gpus"])
def test_scales(preset: str, gpus: int, strategy: dict[str, Any], loader: Loader, tmp_path: Path,
                monkeypatch: pytest.MonkeyPatch) -> None:
    doc = doc_for(preset, gpus, **strategy)
    export, config = export_and_check(doc, loader, tmp_path, monkeypatch)
    assert config.model_spec.flavor == preset.rsplit("-", 1)[1].upper()
    if preset == "llama-3-405b":
        # torchtitan's own 405B recipe is Float8: the export writes a bf16 config function
        assert CONFIG_MODULE + ".py" in export.files and "PYTHONPATH" in export.files[SCRIPT_FILE]
        assert config.training.steps == 3000 and not config.compile.enable_async_tensor_parallel


def test_interleaved_stages_per_rank(loader: Loader, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Virtual stage s runs on pipeline rank s mod pp, in torchtitan as in parplan."""
    from torchtitan.distributed.pipeline_parallel import _get_pp_rank_to_stage_indices_mapping

    doc = doc_for("llama-3-70b", 64, tp=8, pp=4, dp=2, zero=3, sequence_parallel=True, num_microbatches=8,
                  schedule="interleaved", virtual_stages=2)
    _, config = export_and_check(doc, loader, tmp_path, monkeypatch)
    p = config.parallelism
    for rank in range(4):
        assert _get_pp_rank_to_stage_indices_mapping(rank, 4, p.pipeline_parallel_schedule, 8) == (rank, rank + 4)


@pytest.mark.parametrize(("schedule", "v", "second"), [("zbv", 2, 4), ("interleaved-zb", 2, 7), ("dualpipev", 2, 4)])
def test_zero_bubble_stages_per_rank_and_read_back(schedule: str, v: int, second: int, loader: Loader, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """torchtitan runs the zero-bubble schedules on the ranks parplan prices them on (ZBVZeroBubble in
    a V: rank r holds stages r and 2pp - 1 - r; InterleavedZeroBubble looped), and parplan's
    torchtitan import reads the export back as the same schedule and stages."""
    from torchtitan.distributed.pipeline_parallel import _get_pp_rank_to_stage_indices_mapping

    from parplan.imports.torchtitan import read_torchtitan_args
    from parplan.solver.cost.pipeline import virtual_stage_of
    from parplan.solver.strategy import Schedule

    doc = doc_for("llama-3-8b", 8, tp=2, pp=4, dp=1, zero=2, sequence_parallel=True, num_microbatches=8,
                  schedule=schedule, virtual_stages=v)
    export, config = export_and_check(doc, loader, tmp_path, monkeypatch)
    p = config.parallelism
    for rank in range(4):
        theirs = _get_pp_rank_to_stage_indices_mapping(rank, 4, p.pipeline_parallel_schedule, 8)
        assert theirs == tuple(virtual_stage_of(rank, k, 4, Schedule(schedule)) for k in range(v))
    assert theirs[1] == second  # rank 3
    back = read_torchtitan_args(export.files[ARGS_FILE], 8).strategy
    assert (back.schedule, back.virtual_stages, back.pp, back.num_microbatches) == (Schedule(schedule), v, 4, 8)


@pytest.mark.parametrize("strategy", [
    {"dp": 8, "zero": 0, "recompute": "none", "num_microbatches": 4},  # replicate + gradient accumulation
    {"tp": 8, "dp": 1, "zero": 0, "sequence_parallel": False},  # TP without sequence parallelism
    {"tp": 2, "pp": 4, "zero": 2, "dp": 1, "sequence_parallel": True, "schedule": "gpipe", "num_microbatches": 8,
     "partition": [7, 9, 9, 7]},  # uneven stages
    {"dp": 8, "zero": 3, "dp_shard": 4},  # HSDP: shard groups of 4, 2 replicas
], ids=["zero0-accumulation", "tp-without-sp", "gpipe-uneven-partition", "hsdp"])
def test_variants(strategy: dict[str, Any], loader: Loader, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = doc_for("llama-3-8b", 8, **strategy)
    export, config = export_and_check(doc, loader, tmp_path, monkeypatch)
    if strategy.get("tp", 1) > 1 and not strategy.get("sequence_parallel"):
        assert config.parallelism.enable_sequence_parallel is False
        assert any("sequence parallelism off" in n for n in export.notes)


def test_selective_recompute_is_no_checkpointing(loader: Loader, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    doc = doc_for("llama-3-8b", 8, recompute="selective")
    export, config = export_and_check(doc, loader, tmp_path, monkeypatch)
    assert config.activation_checkpoint is None
    assert any(n.startswith("recompute selective -> activation_checkpoint:none") for n in export.notes)


def test_op_recompute_is_torchtitans_selective(loader: Loader, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    doc = doc_for("llama-3-8b", 8, recompute="op")
    from torchtitan.distributed.activation_checkpoint import SelectiveAC

    export, config = export_and_check(doc, loader, tmp_path, monkeypatch)
    assert type(config.activation_checkpoint) is SelectiveAC.Config  # the per-operator policy
    assert any(n.startswith("recompute op -> activation_checkpoint:selective") for n in export.notes)


def test_per_layer_plan_with_one_strategy(loader: Loader, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = per_layer_doc({})
    export = export_torchtitan(doc)
    config = parse(export, loader, tmp_path, monkeypatch)
    uniform = doc_for("llama-3-8b", 16, tp=2, pp=2, dp=4, zero=3, sequence_parallel=True, num_microbatches=8,
                      partition=[16, 16])
    check_config(config, uniform)
    check_launch(export, uniform)


# --- plans torchtitan cannot run -------------------------------------------------------------


def reasons_of(doc: dict[str, Any]) -> list[str]:
    with pytest.raises(NotExpressibleError) as info:
        export_torchtitan(doc)
    assert info.value.target == "torchtitan"
    return info.value.reasons


@pytest.mark.parametrize(("doc", "cause"), [
    (doc_for("llama-3-8b", 8, zero=1), "ZeRO-1"),
    (doc_for("llama-3-8b", 8, zero=1, dp_shard=4), "torchtitan's HSDP"),
    (doc_for("gpt-7.5b", 8), "gpt model"),
    (doc_for("mixtral-8x7b", 8), "no Mixtral module"),
    (doc_for("llama-2-7b", 8), "no torchtitan 0.3.0 llama3 flavor"),
    (doc_for("llama-3-8b", 16, tp=16, dp=1, sequence_parallel=True), "does not divide the 8 kv heads"),
    (doc_for("llama-3-8b", 8, dp=4, expert_parallel=2), "expert parallelism"),
    (doc_for("llama-3-8b", 8, dp=2, cp=4), "all-gathers every layer's keys and values"),
    (doc_for("llama-3-8b", 8, precision="fp16"), "precision fp16"),
    (doc_for("llama-3-8b", 8, precision="fp8-torchao"), "rowwise recipes only"),
    (doc_for("llama-3-8b", 8, precision="fp8-torchao-fsdp8"), "enable_fsdp_float8_all_gather"),
    (doc_for("llama-3-8b", 8, dp=4), "multiply to the world size"),
    (doc_for("llama-3-8b", 8, pp=2, dp=4, partition=[30, 2, 0]), "partition [30, 2, 0]"),
    (per_layer_doc({"recompute": "none", "strategy": "tp2 dp4 zero3 sp recompute=none"}), "different strategies"),
    ({**doc_for("llama-3-8b", 8), "strategy": {"kind": "intra-operator", "summary": "ilp: 42 operators"}},
     "each operator"),
], ids=["zero1", "hsdp-zero1", "gpt", "mixtral", "llama2-sizes", "tp-kv-heads", "expert-parallel",
        "context-parallel", "fp16", "float8-tensorwise", "float8-fsdp", "world", "partition", "per-layer-differs",
        "intra-operator"])
def test_not_expressible(doc: dict[str, Any], cause: str) -> None:
    assert any(cause in r for r in reasons_of(doc)), reasons_of(doc)


def test_every_reason_is_listed() -> None:
    reasons = reasons_of(doc_for("gpt-7.5b", 8, zero=1, precision="fp16"))
    assert len(reasons) == 3
    assert any("gpt" in r for r in reasons) and any("ZeRO-1" in r for r in reasons)
    assert any("fp16" in r for r in reasons)


def test_llama2_reason_names_the_sizes() -> None:
    (reason,) = reasons_of(doc_for("llama-2-7b", 8))
    assert "vocab 32000 (not 128256)" in reason and "ffn 11008 (not 14336)" in reason


@pytest.mark.parametrize("preset", ["llama-3-8b", "llama-3-405b"])
def test_float8_rowwise_model_spec(preset: str, loader: Loader, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """fp8-torchao-rowwise: a config function whose model spec converts every linear layer but the output with
    0.3.0's Float8LinearConverter (rowwise). torchao is not needed to read it back: the converters handed to
    ``model_registry`` are recorded, and the model built without them (building one checks for an FP8 GPU)."""
    import torchtitan.models.llama3 as llama3
    from torchtitan.components.quantization import Float8LinearConverter
    from torchtitan.components.quantization.utils import module_filter_fn

    seen: list[Any] = []
    registry = llama3.model_registry

    def recording(flavor: str, *args: Any, converters: list[Any] | None = None, **kwargs: Any) -> Any:
        seen.extend(converters or [])
        return registry(flavor, *args, **kwargs)

    monkeypatch.setattr(llama3, "model_registry", recording)
    gpus = 8 if preset == "llama-3-8b" else 512
    doc = doc_for(preset, gpus, tp=8 if gpus > 8 else 1, dp=gpus // 8 if gpus > 8 else 8, sequence_parallel=gpus > 8,
                  precision="fp8-torchao-rowwise")
    export, config = export_and_check(doc, loader, tmp_path, monkeypatch)
    assert CONFIG_MODULE + ".py" in export.files
    (converter,) = seen
    assert type(converter) is Float8LinearConverter.Config
    assert (converter.recipe_name, converter.filter_fqns) == ("rowwise", ["lm_head"])
    model = config.model_spec.model
    assert not module_filter_fn(model.lm_head, "lm_head", converter.filter_fqns)
    assert module_filter_fn(model.layers[0].feed_forward.w1, "layers.0.feed_forward.w1", converter.filter_fqns)

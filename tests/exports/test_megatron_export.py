"""Megatron-LM exports, checked by megatron-core's own ``TransformerConfig`` and micro-batch calculator.

The flags ``parplan`` writes are read back by an independent reader: each flag must name a field of
megatron-core's ``TransformerConfig`` by Megatron-LM's naming rule (``--`` + the field with dashes;
the field's own ``arg_names``; ``--no-``/``--disable-`` for a boolean that defaults to true), or be
one the export declares (``DECLARED_FLAGS``, ``TRAINING_FLAGS``), or name a field of megatron-core's
``DistributedDataParallelConfig`` (``DDP_FLAGS``). The configs built from them must pass their own
validation and give back the plan's degrees, sizes and communication overlap.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import pytest
from plan_docs import doc_for

from parplan.exports import NotExpressibleError, export_plan
from parplan.exports.megatron import DDP_FLAGS, DECLARED_FLAGS, OPTIMIZER_FLAGS, TRAINING_FLAGS

mcore = pytest.importorskip("megatron.core", reason="the exports extra (megatron-core) is not installed")

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
    from megatron.core.transformer.transformer_config import TransformerConfig


def _flag_fields() -> dict[str, dataclasses.Field[Any]]:
    """Megatron-LM's flag name -> TransformerConfig field, by its naming rule."""
    out: dict[str, dataclasses.Field[Any]] = {}
    for f in dataclasses.fields(TransformerConfig):
        meta = f.metadata.get("argparse_meta") or {}
        names = list(meta.get("arg_names") or [])
        if not names:
            dashed = f.name.replace("_", "-")
            names = [f"--no-{dashed}", f"--disable-{dashed}"] if f.default is True else [f"--{dashed}"]
        for n in names:
            out[n] = f
    return out


def read_args(text: str) -> tuple[dict[str, Any], dict[str, str | bool]]:
    """(TransformerConfig keyword arguments, the declared flags) from ``megatron_args.txt``."""
    fields = _flag_fields()
    config: dict[str, Any] = {}
    declared: dict[str, str | bool] = {}
    ddp = {f"--{f.name.replace('_', '-')}" for f in dataclasses.fields(DistributedDataParallelConfig)}
    for line in text.splitlines():
        flag, _, value = line.partition(" ")
        if flag in DDP_FLAGS:
            assert flag in ddp, f"{flag} is not a DistributedDataParallelConfig field"
            declared[flag] = value or True
            continue
        if flag in OPTIMIZER_FLAGS:
            assert flag[2:].replace("-", "_") in _optimizer_fields(), f"{flag} is not an OptimizerConfig field"
            declared[flag] = value or True
            continue
        if flag in DECLARED_FLAGS or flag in TRAINING_FLAGS:
            declared[flag] = value or True
            continue
        assert flag in fields, f"{flag} is neither a TransformerConfig field nor a declared Megatron-LM flag"
        f = fields[flag]
        if not value:
            config[f.name] = f.default is not True  # store_true sets True; --disable-x sets False
        else:
            kind = type(f.default) if f.default is not None and not isinstance(f.default, bool) else None
            config[f.name] = kind(value) if kind in (int, float) else (int(value) if value.isdigit() else value)
    return config, declared


def _optimizer_fields() -> set[str]:
    from megatron.core.optimizer import OptimizerConfig

    return {f.name for f in dataclasses.fields(OptimizerConfig)}


def build_ddp_config(declared: dict[str, str | bool]) -> Any:
    """megatron-core's DistributedDataParallelConfig from the data-parallel switches, as Megatron-LM
    builds it (each field from the flag of its name)."""
    kw = {flag[2:].replace("-", "_"): True if v is True else int(v) for flag, v in declared.items()
          if flag in DDP_FLAGS}
    return DistributedDataParallelConfig(**kw)


def build_config(config: dict[str, Any], declared: dict[str, str | bool]) -> TransformerConfig:
    import torch

    kw = dict(config)
    if kw.get("bf16"):  # Megatron-LM derives both from --bf16 (they have no flag of their own)
        kw["params_dtype"] = kw["pipeline_dtype"] = torch.bfloat16
    if "--swiglu" in declared:
        kw["gated_linear_unit"] = True
    if "--num-experts" in declared:
        kw["num_moe_experts"] = int(declared["--num-experts"])
    if "--decoder-first-pipeline-num-layers" in declared:
        kw["num_layers_in_first_pipeline_stage"] = int(declared["--decoder-first-pipeline-num-layers"])
    if "--decoder-last-pipeline-num-layers" in declared:
        kw["num_layers_in_last_pipeline_stage"] = int(declared["--decoder-last-pipeline-num-layers"])
    if "--num-layers-per-virtual-pipeline-stage" in declared:
        per = int(declared["--num-layers-per-virtual-pipeline-stage"])
        kw["virtual_pipeline_model_parallel_size"] = kw["num_layers"] // (kw["pipeline_model_parallel_size"] * per)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return TransformerConfig(**kw)


CASES = [
    ("gpt-7.5b", 8, {"tp": 8, "pp": 1, "dp": 1, "sequence_parallel": True, "micro_batch": 2, "num_microbatches": 8}),
    ("llama-3-8b", 8, {"tp": 2, "pp": 1, "dp": 4, "zero": 1, "sequence_parallel": True, "num_microbatches": 4}),
    ("llama-2-70b", 64, {"tp": 8, "pp": 4, "dp": 2, "zero": 1, "sequence_parallel": True, "recompute": "full",
                         "num_microbatches": 16}),
    ("llama-3-70b", 64, {"tp": 4, "pp": 4, "dp": 4, "num_microbatches": 8, "schedule": "interleaved",
                         "virtual_stages": 5}),
    ("mixtral-8x7b", 64, {"tp": 4, "pp": 2, "dp": 8, "zero": 1, "expert_parallel": 8, "sequence_parallel": True,
                          "num_microbatches": 4}),
    # hybrid sharding: the distributed optimizer within each node's 2 ranks, 4 instances
    ("llama-3-8b", 32, {"tp": 4, "pp": 1, "dp": 8, "zero": 1, "dp_shard": 2, "sequence_parallel": True,
                        "num_microbatches": 2}),
    ("llama-3-405b", 1024, {"tp": 8, "pp": 16, "dp": 8, "zero": 1, "sequence_parallel": True,
                            "num_microbatches": 64, "partition": [7] + [8] * 14 + [7]}),
    ("gpt3-175b", 1024, {"tp": 8, "pp": 8, "dp": 16, "zero": 1, "sequence_parallel": True,
                         "num_microbatches": 32}),
    # the Llama 3 paper's long-context layout: CP 16 over the p2p ring (cp_comm_type's default)
    ("llama-3.1-405b", 16384, {"tp": 8, "pp": 16, "dp": 8, "cp": 16, "zero": 1, "sequence_parallel": True,
                               "num_microbatches": 16, "partition": [7] + [8] * 14 + [7]}),
    # the all-to-all exchange (Ulysses): tp x cp = 8 divides the 64 heads and the 8 key/value heads
    ("llama-3-70b", 16, {"tp": 2, "pp": 1, "dp": 2, "cp": 4, "cp_comm": "a2a", "sequence_parallel": True,
                         "num_microbatches": 2}),
]


@pytest.mark.parametrize(("preset", "gpus", "strategy"), CASES, ids=[f"{p}-{g}" for p, g, _ in CASES])
def test_megatron_core_accepts_the_exported_configuration(preset: str, gpus: int, strategy: dict[str, Any]) -> None:
    doc = doc_for(preset, gpus, strategy)
    out = export_plan(doc, "megatron")
    assert out.version == "core_v0.16.1" and "core_v0.16.1" in out.files["launch_megatron.sh"]
    config, declared = read_args(out.files["megatron_args.txt"])
    cfg = build_config(config, declared)
    s, arch = doc["strategy"], doc["model"]["architecture"]
    assert (cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size) == (s["tp"], s["pp"])
    assert cfg.sequence_parallel == s["sequence_parallel"]
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.ffn_hidden_size) == (
        arch["layers"], arch["hidden"], arch["heads"], arch["ffn"])
    assert cfg.num_query_groups in (None, arch["kv_heads"] or arch["heads"]) or arch["kv_heads"] == arch["heads"]
    assert cfg.recompute_granularity == (None if s["recompute"] == "none" else s["recompute"])
    # the model's dropout, not Megatron-LM's default of 0.1 (Llama-style models have none: their masks
    # would be memory the plan does not count)
    dropout = 0.1 if arch["family"] == "gpt" else 0.0
    assert cfg.hidden_dropout == cfg.attention_dropout == dropout
    assert cfg.expert_model_parallel_size == s["expert_parallel"]
    assert cfg.context_parallel_size == s.get("cp", 1)
    assert cfg.cp_comm_type == (s.get("cp_comm", "p2p") if s.get("cp", 1) > 1 else None)
    assert ("--use-distributed-optimizer" in declared) == (s["zero"] == 1)
    dp = gpus // (s["tp"] * s["pp"] * s.get("cp", 1))
    ddp = build_ddp_config(declared)
    assert ddp.use_distributed_optimizer == (s["zero"] == 1)
    assert ddp.num_distributed_optimizer_instances == dp // (s.get("dp_shard") or dp)
    # priced with the gradient reduction under the backward whenever there is one
    assert ddp.overlap_grad_reduce == (dp * s.get("cp", 1) > 1)
    assert not ddp.overlap_param_gather and not cfg.tp_comm_overlap
    calc = ConstantNumMicroBatchesCalculator(int(declared["--global-batch-size"]),
                                             int(declared["--micro-batch-size"]), dp, None, 0)
    assert calc.get() == s["num_microbatches"]
    assert len(out.launch) == max(1, gpus // 8)
    assert all(f"--node-rank {i} " in line for i, line in enumerate(out.launch))
    if s.get("partition") and len(set(s["partition"])) > 1:
        assert cfg.num_layers_in_first_pipeline_stage == s["partition"][0]
        assert cfg.num_layers_in_last_pipeline_stage == s["partition"][-1]


def test_the_overlap_options_a_plan_was_priced_with_reach_megatron_core() -> None:
    """``parplan memory --tp-comm-overlap --overlap-param-gather`` prices both; the export writes both."""
    doc = doc_for("llama-3-8b", 16, {"tp": 2, "pp": 1, "dp": 8, "zero": 1, "sequence_parallel": True,
                                     "num_microbatches": 2, "tp_comm_overlap": True, "overlap_param_gather": True})
    config, declared = read_args(export_plan(doc, "megatron").files["megatron_args.txt"])
    ddp = build_ddp_config(declared)
    assert ddp.overlap_grad_reduce and ddp.overlap_param_gather and ddp.use_distributed_optimizer
    assert build_config(config, declared).tp_comm_overlap
    alone = doc_for("llama-3-8b", 1, {"tp": 1, "pp": 1, "dp": 1, "num_microbatches": 2})
    _, declared = read_args(export_plan(alone, "megatron").files["megatron_args.txt"])
    assert not build_ddp_config(declared).overlap_grad_reduce  # one rank: no gradient reduction
    # priced with the reduction after the backward (`parplan memory --no-overlap-grad-reduce`, or imported
    # arguments without the flag): exported without it, so Megatron-LM runs what was priced
    after = doc_for("llama-3-8b", 16, {"tp": 2, "pp": 1, "dp": 8, "zero": 1, "sequence_parallel": True,
                                       "num_microbatches": 2, "overlap_grad_reduce": False})
    _, declared = read_args(export_plan(after, "megatron").files["megatron_args.txt"])
    assert not build_ddp_config(declared).overlap_grad_reduce


def test_megatron_core_rejects_what_the_export_would_get_wrong() -> None:
    """The oracle can fail: heads not divisible by TP is refused by TransformerConfig itself."""
    doc = doc_for("llama-3-8b", 8, {"tp": 8, "pp": 1, "dp": 1, "num_microbatches": 1})
    config, declared = read_args(export_plan(doc, "megatron").files["megatron_args.txt"])
    config["tensor_model_parallel_size"] = 3
    with pytest.raises(ValueError, match="multiple of tensor_model_parallel_size"):
        build_config(config, declared)


@pytest.mark.parametrize(("preset", "strategy", "reason"), [
    ("llama-3-8b", {"tp": 1, "pp": 1, "dp": 8, "zero": 3}, "ZeRO-3"),
    ("llama-3-8b", {"tp": 1, "pp": 1, "dp": 8, "zero": 2}, "ZeRO-2"),
    ("bert-large", {"tp": 2, "pp": 1, "dp": 4}, "bert model"),
    ("llama-3-8b", {"tp": 1, "pp": 4, "dp": 2, "partition": [10, 6, 10, 6]}, "first and last"),
    ("llama-3-8b", {"tp": 1, "pp": 2, "dp": 4, "schedule": "gpipe"}, "GPipe"),
])
def test_what_megatron_cannot_run_is_refused_with_the_reason(preset: str, strategy: dict[str, Any],
                                                             reason: str) -> None:
    doc = doc_for(preset, 8, {"num_microbatches": 4} | strategy)
    with pytest.raises(NotExpressibleError) as info:
        export_plan(doc, "megatron")
    assert any(reason in r for r in info.value.reasons), info.value.reasons


def test_context_parallelism_needs_the_sequence_in_2cp_chunks_of_whole_tp_shards() -> None:
    doc = doc_for("llama-3-8b", 8, {"tp": 2, "pp": 1, "dp": 1, "cp": 4, "sequence_parallel": True,
                                    "num_microbatches": 4})
    doc["model"]["seq_len"] = 1000  # 1000 = 8 x 125: two chunks per CP rank, but 125 tokens do not split over tp 2
    with pytest.raises(NotExpressibleError, match="2 x cp chunks"):
        export_plan(doc, "megatron")
    doc["model"]["seq_len"] = 1024
    config, declared = read_args(export_plan(doc, "megatron").files["megatron_args.txt"])
    assert build_config(config, declared).context_parallel_size == 4
    doc["strategy"]["cp_comm"] = "a2a"  # the all-to-all splits the 8 key/value heads over tp x cp
    doc["strategy"]["tp"], doc["strategy"]["cp"], doc["strategy"]["dp"] = 4, 4, 1
    doc["cluster"]["gpus"] = 16
    with pytest.raises(NotExpressibleError, match="tp x cp = 16"):
        export_plan(doc, "megatron")


def test_per_operator_and_mixed_per_layer_plans_are_refused() -> None:
    ilp = {"model": {"name": "x", "seq_len": 8}, "cluster": {"gpus": 8, "gpus_per_node": 8},
           "strategy": {"kind": "intra-operator", "summary": "mesh 4x2"}}
    with pytest.raises(NotExpressibleError, match="each operator"):
        export_plan(ilp, "megatron")
    runs = [{"first": "layers.0", "last": "layers.0", "count": 1, "strategy": "tp4 dp2", "stage": 0, "tp": 4,
             "dp": 2, "zero": 0, "sequence_parallel": True, "recompute": "selective", "tp_inner": True,
             "expert_parallel": 1},
            {"first": "layers.1", "last": "layers.31", "count": 31, "strategy": "tp2 dp4", "stage": 0, "tp": 2,
             "dp": 4, "zero": 0, "sequence_parallel": True, "recompute": "selective", "tp_inner": True,
             "expert_parallel": 1}]
    mixed = doc_for("llama-3-8b", 8, {"tp": 1, "pp": 1, "dp": 8, "num_microbatches": 1})
    mixed["strategy"] = {"kind": "per-layer", "pp": 1, "num_microbatches": 2, "global_batch": 16, "partition": [32],
                         "schedule": "1f1b", "precision": "bf16", "layers": runs}
    with pytest.raises(NotExpressibleError, match="2 different strategies"):
        export_plan(mixed, "megatron")
    same = dict(mixed, strategy=dict(mixed["strategy"], layers=[dict(runs[1], first="layers.0", count=32)]))
    config, declared = read_args(export_plan(same, "megatron").files["megatron_args.txt"])
    assert build_config(config, declared).tensor_model_parallel_size == 2
    assert declared["--micro-batch-size"] == "2"  # 16 samples / (2 micro-batches x dp 4)


@pytest.mark.parametrize("preset", ["qwen2.5-7b", "qwen3-32b"])
def test_megatron_core_builds_qwen_with_its_biases_and_norms(preset: str) -> None:
    """Qwen2's q/k/v biases (--add-qkv-bias beside --disable-bias-linear) and Qwen3's q/k norms
    (--qk-layernorm, with its 128-wide heads as --kv-channels) reach megatron-core's config, and
    parplan's import of the file gives back the same model (its parameter count)."""
    from parplan.imports import read_config
    from parplan.solver.frontends.presets import get_preset
    from parplan.solver.models import ModelSource

    doc = doc_for(preset, 8, {"tp": 4, "pp": 1, "dp": 2, "zero": 1, "sequence_parallel": True, "num_microbatches": 4})
    text = export_plan(doc, "megatron").files["megatron_args.txt"]
    cfg = build_config(*read_args(text))
    arch = doc["model"]["architecture"]
    assert (cfg.add_qkv_bias, cfg.qk_layernorm, cfg.add_bias_linear) == (arch["qkv_bias"], arch["qk_norm"], False)
    assert cfg.kv_channels == (arch["head_dim"] or arch["hidden"] // arch["heads"])
    imported = read_config("megatron-args", text, gpus=8)
    assert imported.model is not None
    config = imported.model.config
    assert config is not None and (config.qkv_bias, config.qk_norm) == (arch["qkv_bias"], arch["qk_norm"])
    want = ModelSource(preset, config=get_preset(preset)).parameter_count()
    assert imported.model.parameter_count() == want


@pytest.mark.parametrize("fraction", [0.5, 1.0])
def test_optimizer_offload_is_megatron_cores_hybrid_optimizer(fraction: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """The offload flags build megatron-core's OptimizerConfig (which skips its FusedAdam check under
    ``optimizer_cpu_offload``) with the plan's fraction, beside the distributed optimizer it needs.
    Transformer Engine is not installed here: its version check answers as TE 2.1 would."""
    from megatron.core.optimizer import OptimizerConfig, optimizer_config

    monkeypatch.setattr(optimizer_config, "is_te_min_version", lambda version: True)

    doc = doc_for("llama-3-8b", 8, {"tp": 2, "pp": 1, "dp": 4, "zero": 1, "sequence_parallel": True,
                                    "num_microbatches": 4, "optimizer_offload": fraction})
    _, declared = read_args(export_plan(doc, "megatron").files["megatron_args.txt"])
    kw = {flag[2:].replace("-", "_"): (float(v) if isinstance(v, str) else v)
          for flag, v in declared.items() if flag in OPTIMIZER_FLAGS}
    cfg = OptimizerConfig(**kw, use_distributed_optimizer="--use-distributed-optimizer" in declared)
    assert cfg.optimizer_cpu_offload and cfg.use_precision_aware_optimizer and cfg.use_distributed_optimizer
    assert cfg.optimizer_offload_fraction == fraction


def test_optimizer_offload_without_the_distributed_optimizer_is_refused() -> None:
    doc = doc_for("llama-3-8b", 8, {"tp": 2, "pp": 1, "dp": 4, "sequence_parallel": True, "num_microbatches": 4})
    doc["strategy"]["optimizer_offload"] = 0.5  # a document no search writes: ZeRO-0 offloaded
    with pytest.raises(NotExpressibleError, match="distributed optimizer"):
        export_plan(doc, "megatron")


@pytest.mark.parametrize(("model", "recompute"), [("mixtral-8x7b", "selective:core_attn+moe_act+layernorm"),
                                                  ("mixtral-8x7b", "selective:moe+shared_experts"),
                                                  ("gpt-1.7b", "selective:core_attn+mlp")])
def test_recompute_modules_reach_megatron_core_and_read_back_to_the_same_prices(
        tmp_path: Any, capsys: pytest.CaptureFixture[str], model: str, recompute: str) -> None:
    """A module set priced by ``parplan memory --recompute selective:...`` is exported as Megatron-LM's
    ``--recompute-granularity selective --recompute-modules ...`` (with the grouped GEMM moe_act needs),
    which megatron-core's TransformerConfig accepts as that module list; read back, it prices the same."""
    import json

    from parplan.cli import main
    from parplan.solver.cost.activations import Recompute

    assert main(["memory", "--model", model, "--gpus", "16", "--tp", "2", "--sequence-parallel", "--zero", "1",
                 "--global-batch", "32", "--recompute", recompute, "--json"]) == 0
    (tmp_path / "priced.json").write_text(capsys.readouterr().out)
    priced = json.loads((tmp_path / "priced.json").read_text())
    assert main(["export", str(tmp_path / "priced.json"), "--target", "megatron", "--out", str(tmp_path / "out")]) == 0
    capsys.readouterr()
    config, declared = read_args((tmp_path / "out" / "megatron_args.txt").read_text())
    config["recompute_modules"] = str(config["recompute_modules"]).split()  # nargs="*"
    cfg = build_config(config, declared)
    assert cfg.recompute_granularity == "selective"
    assert set(cfg.recompute_modules) == Recompute(recompute).modules
    assert cfg.moe_grouped_gemm == ("moe_act" in cfg.recompute_modules)
    assert main(["memory", "--from", "megatron-args", str(tmp_path / "out" / "megatron_args.txt"), "--gpus", "16",
                 "--json"]) == 0
    back = json.loads(capsys.readouterr().out)
    assert back["strategy"]["recompute"] == priced["strategy"]["recompute"] == Recompute(recompute).value
    assert back["memory"]["peak_bytes"] == priced["memory"]["peak_bytes"]
    assert back["time"]["step_seconds"] == pytest.approx(priced["time"]["step_seconds"], rel=1e-12)


def test_megatron_core_refuses_moe_act_without_the_grouped_gemm() -> None:
    """The oracle can fail: the flag the export adds for moe_act is one megatron-core needs."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="moe_grouped_gemm"):
            TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, num_moe_experts=4,
                              recompute_granularity="selective", recompute_modules=["moe_act"])


@pytest.mark.parametrize(("target", "reason"), [("deepspeed", "--recompute-modules"),
                                                ("nanotron", "--recompute-modules"),
                                                ("torchtitan", "recomputation 'selective:core_attn+mlp'"),
                                                ("galvatron", "selective:core_attn+mlp")])
def test_other_trainers_refuse_megatron_module_sets(target: str, reason: str) -> None:
    doc = doc_for("llama-2-7b", 8, {"tp": 1, "pp": 1, "dp": 8, "num_microbatches": 1,
                                    "recompute": "selective:core_attn+mlp"})
    with pytest.raises(NotExpressibleError) as info:
        export_plan(doc, target)
    assert any(reason in r for r in info.value.reasons), info.value.reasons


def test_moe_act_on_a_dense_model_is_refused_by_the_megatron_export() -> None:
    doc = doc_for("llama-3-8b", 8, {"tp": 1, "pp": 1, "dp": 8, "num_microbatches": 1, "recompute": "selective:moe_act"})
    with pytest.raises(NotExpressibleError, match="moe_act on a dense model"):
        export_plan(doc, "megatron")


@pytest.mark.parametrize(("preset", "fields"), [
    ("gpt-1.7b", {"norm": "rmsnorm", "positions": "rope", "linear_bias": False}),
    ("gpt-1.7b", {"positions": "none", "qk_norm": True}),
    ("llama-3-8b", {"norm": "layernorm", "positions": "learned", "linear_bias": True}),
])
def test_normalisation_positions_and_biases_reach_megatron_core_and_come_back(preset: str,
                                                                               fields: dict[str, Any]) -> None:
    """An architecture's own normalisation, positions and linear biases are written as
    --normalization, --position-embedding-type and --disable-bias-linear: megatron-core's config takes
    them, and parplan's import of the file gives back the same architecture and parameter count."""
    from parplan.imports import read_config
    from parplan.solver.frontends.config import TransformerConfig as Arch
    from parplan.solver.models import ModelSource

    doc = doc_for(preset, 8, {"tp": 2, "pp": 1, "dp": 4, "zero": 1, "num_microbatches": 4})
    arch = doc["model"]["architecture"] = doc["model"]["architecture"] | fields
    want = Arch(**arch)
    text = export_plan(doc, "megatron").files["megatron_args.txt"]
    config, declared = read_args(text)
    cfg = build_config(config, declared)
    assert cfg.normalization == {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}[want.norm_kind]
    assert (cfg.add_bias_linear, cfg.qk_layernorm) == (want.linear_biases, want.qk_norm)
    assert declared["--position-embedding-type"] == {"learned": "learned_absolute"}.get(want.position_kind,
                                                                                         want.position_kind)
    imported = read_config("megatron-args", text, gpus=8)
    assert imported.model is not None and imported.model.config is not None
    back = imported.model.config
    assert (back.norm, back.positions, back.linear_bias, back.qk_norm) == (want.norm, want.positions,
                                                                            want.linear_bias, want.qk_norm)
    assert imported.model.parameter_count() == ModelSource(preset, config=want).parameter_count()


@pytest.mark.parametrize("target", ["deepspeed", "torchtitan", "nanotron", "galvatron"])
def test_other_targets_refuse_a_normalisation_they_do_not_write(target: str) -> None:
    preset = "gpt-1.7b" if target in ("deepspeed", "galvatron") else "llama-3-8b"
    doc = doc_for(preset, 8, {"tp": 1, "pp": 1, "dp": 8, "zero": 1, "num_microbatches": 1})
    own = doc["model"]["architecture"]["family"] == "gpt"
    doc["model"]["architecture"] |= {"norm": "rmsnorm" if own else "layernorm"}
    with pytest.raises(NotExpressibleError, match="normalisation"):
        export_plan(doc, target)


def test_an_expert_tensor_parallel_size_reaches_megatron_core_and_comes_back() -> None:
    """A plan whose experts run on their own tensor-parallel size (imported from Megatron-LM's
    --expert-tensor-parallel-size) is written back as that flag: megatron-core's TransformerConfig takes
    it as expert_tensor_parallel_size, and parplan's import of the file gives the same strategy."""
    from parplan.imports import read_config

    doc = doc_for("mixtral-8x7b", 16, {"tp": 4, "pp": 2, "dp": 2, "zero": 1, "expert_parallel": 4,
                                       "expert_tensor_parallel": 1, "sequence_parallel": True,
                                       "num_microbatches": 4})
    text = export_plan(doc, "megatron").files["megatron_args.txt"]
    config, declared = read_args(text)
    cfg = build_config(config, declared)
    assert (cfg.tensor_model_parallel_size, cfg.expert_tensor_parallel_size, cfg.expert_model_parallel_size) == (
        4, 1, 4)
    back = read_config("megatron-args", text, gpus=16).strategy
    assert (back.tp, back.dp, back.expert_parallel, back.expert_tensor_parallel) == (4, 2, 4, 1)


@pytest.mark.parametrize("target", ["deepspeed", "torchtitan", "nanotron", "galvatron"])
def test_other_targets_refuse_an_expert_tensor_parallel_size(target: str) -> None:
    doc = doc_for("mixtral-8x7b", 16, {"tp": 2, "pp": 1, "dp": 8, "zero": 1, "expert_parallel": 8,
                                       "expert_tensor_parallel": 1, "sequence_parallel": True,
                                       "num_microbatches": 1})
    with pytest.raises(NotExpressibleError, match="expert_tensor_parallel 1"):
        export_plan(doc, target)

"""nanotron: the YAML config ``run_train.py --config-file`` reads, and its ``torchrun`` line.

Written in the schema of nanotron's ``nanotron.config.Config`` as the Ultra-Scale Playbook's
benchmarks ran it (docs/nanotron.md pins the commit; PyPI's nanotron 0.4 is older and lacks
``recompute_layer``). nanotron trains its Llama with TP (``tp_mode`` ALL_REDUCE, or REDUCE_SCATTER:
sequence parallelism), PP (its ``1f1b`` or ``afab`` engine, the layers split by its own cost model),
DP with ZeRO 0 or 1, whole-layer recomputation, fp32 gradient accumulation. It splits the layers over
the pipeline ranks itself, so a plan whose partition is not nanotron's is not expressed; the data
section is nanotron's dummy generator (give your own datasets).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from parplan.exports.common import SIZES_HINT, Export, NotExpressible, UniformPlan, context_of, uniform_of
from parplan.solver.cost.nanotron import nanotron_partition

NANOTRON_VERSION = "main (the Ultra-Scale Playbook's benchmarks; docs/nanotron.md)"
TARGET = "nanotron"
#: parplan's precision -> ``model.dtype``.
DTYPES = {"bf16": "bfloat16", "fp16": "float16"}
#: parplan's schedule -> ``parallelism.pp_engine``.
ENGINES = {"1f1b": "1f1b", "gpipe": "afab"}


def _reasons(plan: UniformPlan, arch: Mapping[str, Any] | None) -> list[str]:
    reasons = []
    if arch is None or arch.get("family") != "llama":
        reasons.append("nanotron's Llama is the model it trains; " + (SIZES_HINT if arch is None else
                                                                      f"this one is a {arch.get('family')}"))
    if plan.zero > 1:
        reasons.append(f"ZeRO-{plan.zero} (nanotron has ZeRO 0 and 1)")
    if plan.schedule not in ENGINES:
        reasons.append(f"the {plan.schedule} schedule (nanotron's engines: 1f1b, afab)")
    if plan.recompute.startswith("selective:"):
        reasons.append(f"recompute {plan.recompute} (Megatron-LM's --recompute-modules); "
                       "nanotron recomputes whole layers or nothing")
    if plan.recompute == "op":
        reasons.append("per-operator recomputation (op: PyTorch's selective checkpointing with torchtitan's "
                       "policy); nanotron recomputes whole layers or nothing (plan with --target nanotron)")
    if plan.recompute == "selective":
        reasons.append("selective recomputation (nanotron recomputes whole layers or nothing; plan with "
                       "--target nanotron)")
    if plan.precision not in DTYPES:
        reasons.append(f"precision {plan.precision} (nanotron with fp32 accumulation: bf16, fp16)")
    if plan.cp > 1 or plan.expert_parallel > 1:
        reasons.append("context or expert parallelism of a dense Llama")
    if plan.sequence_parallel and plan.tp == 1:
        reasons.append("sequence parallelism without tensor parallelism")
    if plan.dp_shard:
        reasons.append(f"hybrid sharding (dp_shard {plan.dp_shard}): nanotron's ZeRO-1 shards over all of dp")
    if arch is not None and arch.get("family") == "llama" and plan.pp > 1:
        own = nanotron_partition(int(arch["layers"]), int(arch["hidden"]), int(arch["heads"]), int(arch["ffn"]),
                                 int(arch["vocab"]), plan.pp)
        given = plan.partition
        if (given is not None and tuple(given) != own) or (given is None and len(set(own)) > 1):
            reasons.append(f"the layers split {list(given) if given else 'evenly'} over the pipeline ranks; nanotron "
                           f"splits them {list(own)} (plan with --target nanotron)")
    return reasons


def nanotron_config(plan: UniformPlan, arch: Mapping[str, Any], seq_len: int) -> dict[str, Any]:
    """nanotron's Config of a plan (NotExpressible with every reason when nanotron cannot run it)."""
    reasons = _reasons(plan, arch)
    if reasons:
        raise NotExpressible(TARGET, reasons)
    kv = arch.get("kv_heads") or arch["heads"]
    return {
        "general": {"project": "parplan", "run": "parplan_plan", "seed": 42, "ignore_sanity_checks": True},
        "parallelism": {"dp": plan.dp, "tp": plan.tp, "pp": plan.pp, "pp_engine": ENGINES[plan.schedule],
                        "tp_mode": "REDUCE_SCATTER" if plan.sequence_parallel else "ALL_REDUCE",
                        "tp_linear_async_communication": plan.sequence_parallel,
                        "recompute_layer": plan.recompute == "full", "tp_recompute_allgather": True,
                        "expert_parallel_size": 1},
        "model": {"dtype": DTYPES[plan.precision], "make_vocab_size_divisible_by": 1, "ddp_bucket_cap_mb": 25,
                  "init_method": {"std": 0.02},
                  "model_config": {"is_llama_config": True, "hidden_act": "silu", "hidden_size": arch["hidden"],
                                   "intermediate_size": arch["ffn"], "num_attention_heads": arch["heads"],
                                   "num_key_value_heads": kv, "num_hidden_layers": arch["layers"],
                                   "vocab_size": arch["vocab"], "tie_word_embeddings": bool(arch["tied_embeddings"]),
                                   "max_position_embeddings": seq_len, "rms_norm_eps": 1e-5,
                                   "rope_theta": 10000.0}},
        "tokens": {"sequence_length": seq_len, "micro_batch_size": plan.micro_batch,
                   "batch_accumulation_per_replica": plan.num_microbatches, "train_steps": 100},
        "optimizer": {"zero_stage": plan.zero, "accumulate_grad_in_fp32": True, "clip_grad": 1.0,
                      "weight_decay": 0.01,
                      "optimizer_factory": {"name": "adamW", "adam_beta1": 0.9, "adam_beta2": 0.95,
                                            "adam_eps": 1e-8, "torch_adam_is_fused": True},
                      "learning_rate_scheduler": {"learning_rate": 3e-4, "lr_warmup_steps": 10,
                                                  "lr_warmup_style": "linear", "lr_decay_style": "cosine",
                                                  "min_decay_lr": 3e-5}},
        "data_stages": [{"name": "Stable Training Stage", "start_training_step": 1,
                         "data": {"dataset": None, "seed": 42, "num_loading_workers": 1}}],
        "tokenizer": {"tokenizer_name_or_path": None},
        "checkpoints": {"checkpoints_path": "checkpoints", "checkpoint_interval": 1000},
        "logging": {"log_level": "info", "log_level_replica": "info", "iteration_step_info_interval": 1},
    }


def export_nanotron(doc: Mapping[str, Any]) -> Export:
    """``nanotron_config.yaml`` and a ``torchrun`` line per node."""
    import yaml

    plan = uniform_of(doc, TARGET)
    ctx = context_of(doc)
    if plan.world != ctx.gpus:
        raise NotExpressible(TARGET, [f"{plan.degrees} devices, the cluster has {ctx.gpus}"])
    cfg = nanotron_config(plan, ctx.architecture or {}, ctx.seq_len) if ctx.architecture else None
    if cfg is None:
        raise NotExpressible(TARGET, [f"the model has no sizes: {SIZES_HINT}"])
    launch = [f"CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --nnodes {ctx.nodes} --nproc-per-node {ctx.procs_per_node} "
              "--rdzv-backend c10d --rdzv-endpoint $MASTER_ADDR:$MASTER_PORT run_train.py --config-file "
              "nanotron_config.yaml"]
    notes = [f"nanotron {NANOTRON_VERSION}: data_stages uses nanotron's dummy data; set your datasets and tokenizer",
             "CUDA_DEVICE_MAX_CONNECTIONS=1 is what nanotron's tensor-parallel linears assert"]
    runtime = doc["strategy"].get("runtime")
    if runtime and runtime != TARGET:
        notes.append(f"the plan was priced for runtime {runtime}; plan with --target nanotron for nanotron's buffers")
    text = yaml.safe_dump(cfg, sort_keys=False)
    return Export(TARGET, NANOTRON_VERSION, {"nanotron_config.yaml": text}, launch, notes)


__all__ = ["NANOTRON_VERSION", "export_nanotron", "nanotron_config"]

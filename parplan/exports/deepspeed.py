"""DeepSpeed: ``ds_config.json`` and the ``deepspeed`` launch line.

Pinned to DeepSpeed 0.19.8. DeepSpeed's engine runs data parallelism with ZeRO stages 0-3, micro-
batches and gradient accumulation; tensor parallelism and pipeline stages need the model's own code
(Megatron-DeepSpeed, ``PipelineModule``), so a plan with ``tp > 1`` or ``pp > 1`` is not expressed
here. Full recomputation is DeepSpeed's activation checkpointing, which the training script applies
to each block (``deepspeed.checkpointing.checkpoint``); the config carries its settings.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from parplan.exports.common import Export, NotExpressible, UniformPlan, context_of, uniform_of
from parplan.solver.cost.runtime import DEEPSPEED_BUCKET_ELEMENTS

DEEPSPEED_VERSION = "0.19.8"
TARGET = "deepspeed"


def ds_config(plan: UniformPlan) -> dict[str, Any]:
    """The DeepSpeed configuration of a data-parallel plan (NotExpressible with every reason when
    it is not one)."""
    reasons = []
    if plan.tp > 1:
        reasons.append(f"tensor parallelism (tp={plan.tp}) needs the model's own tensor-parallel layers; "
                       "DeepSpeed's config sets data parallelism only")
    if plan.pp > 1:
        reasons.append(f"{plan.pp} pipeline stages need the model written as a DeepSpeed PipelineModule")
    if plan.expert_parallel > 1:
        reasons.append(f"expert parallelism (ep={plan.expert_parallel})")
    if plan.cp > 1:
        reasons.append(f"context parallelism (cp={plan.cp}): DeepSpeed's config has no ring attention (its "
                       "Ulysses sequence parallelism needs the model's own code); plan with target deepspeed")
    if plan.precision not in ("bf16", "fp16", "fp32"):
        reasons.append(f"precision {plan.precision}")
    if plan.dp_shard:
        reasons.append(f"hybrid sharding (dp_shard {plan.dp_shard}): DeepSpeed shards ZeRO over all of dp; its "
                       "ZeRO++ hpZ (zero_hpz_partition_size) keeps a secondary copy of the weights per node, which "
                       "parplan does not model")
    if plan.optimizer_offload and (plan.optimizer_offload != 1 or plan.zero < 1):
        reasons.append(f"optimizer offload {plan.optimizer_offload:g} at ZeRO-{plan.zero}: DeepSpeed's ZeRO-Offload "
                       "(offload_optimizer) moves the whole optimizer, under ZeRO 1-3")
    if plan.recompute.startswith("selective:"):
        reasons.append(f"recompute {plan.recompute} (Megatron-LM's --recompute-modules); "
                       "DeepSpeed's config checkpoints whole blocks or none")
    if plan.recompute == "op":
        reasons.append("per-operator recomputation (op: PyTorch's selective checkpointing with torchtitan's policy); "
                       "DeepSpeed's config checkpoints whole blocks or none (plan with --target deepspeed)")
    if reasons:
        raise NotExpressible(TARGET, reasons)
    cfg: dict[str, Any] = {
        "train_batch_size": plan.global_batch,
        "train_micro_batch_size_per_gpu": plan.micro_batch,
        "gradient_accumulation_steps": plan.num_microbatches,
        "zero_optimization": {"stage": plan.zero},
    }
    if plan.precision in ("bf16", "fp16"):
        cfg[plan.precision] = {"enabled": True}
    # the buckets the deepspeed runtime prices (DEEPSPEED_BUCKET_BYTES), not DeepSpeed's larger defaults
    zero = cfg["zero_optimization"]
    zero["reduce_bucket_size"] = zero["allgather_bucket_size"] = DEEPSPEED_BUCKET_ELEMENTS
    if plan.zero == 3:
        # parameters gathered per block and freed after use (parplan prices one block's gathered weights
        # and the next one prefetched): keep DeepSpeed from holding more
        for key in ("stage3_prefetch_bucket_size", "stage3_max_live_parameters", "stage3_max_reuse_distance"):
            zero[key] = DEEPSPEED_BUCKET_ELEMENTS
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    if plan.optimizer_offload:
        # ZeRO-Offload: the fp32 partition, its gradients and Adam's moments on the host (pinned), stepped there
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if plan.recompute == "full":
        cfg["activation_checkpointing"] = {"partition_activations": False, "contiguous_memory_optimization": False,
                                           "cpu_checkpointing": False}
    return cfg


def export_deepspeed(doc: Mapping[str, Any]) -> Export:
    """``ds_config.json`` and a ``deepspeed`` command that starts every node."""
    plan = uniform_of(doc, TARGET)
    ctx = context_of(doc)
    cfg = ds_config(plan)
    if plan.world != ctx.gpus:
        raise NotExpressible(TARGET, [f"dp = {plan.world} devices, the cluster has {ctx.gpus}"])
    launch = (f"deepspeed --num_nodes {ctx.nodes} --num_gpus {ctx.procs_per_node} --hostfile hostfile "
              "--master_addr $MASTER_ADDR --master_port $MASTER_PORT train.py --deepspeed --deepspeed_config "
              "ds_config.json")
    notes = [f"DeepSpeed {DEEPSPEED_VERSION}: train.py is your script, calling deepspeed.initialize(model=..., "
             "config='ds_config.json'); the optimizer and scheduler sections are yours to add",
             "hostfile lists every node with slots=" + str(ctx.procs_per_node),
             f"the communication buckets are set to {DEEPSPEED_BUCKET_ELEMENTS:,} elements (DeepSpeed's reduce "
             "default is ten times larger): the prediction counts them at that size; raising them adds memory"]
    if plan.recompute == "full":
        notes.append("full recomputation: wrap each transformer block's forward in "
                     "deepspeed.checkpointing.checkpoint")
    runtime = doc["strategy"].get("runtime")
    if runtime and runtime != TARGET:
        notes.append(f"the plan was priced for runtime {runtime}; plan with --target deepspeed for DeepSpeed's "
                     "buffers")
    if plan.overlap_param_gather:
        notes.append("the step time counts Megatron-LM's --overlap-param-gather (the updated weights' all-gather "
                     "under the next forward); DeepSpeed gathers them after the optimizer step, so its step is "
                     "longer than the plan's by up to that all-gather")
    text = json.dumps(cfg, indent=2) + "\n"
    return Export(TARGET, DEEPSPEED_VERSION, {"ds_config.json": text}, [launch], notes)

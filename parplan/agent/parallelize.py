"""Tensor and data parallelism of one pipeline stage with PyTorch's own APIs: Megatron's
column/row split with ``parallelize_module`` (sequence parallelism included), and DDP,
``replicate`` or FSDP2 over the data-parallel mesh dimension."""

from __future__ import annotations

from typing import Any

from torch import nn

from parplan.agent.model import StageModule
from parplan.agent.run_spec import RunSpec


def apply_tp(sm: StageModule, tp_mesh: Any, sp: bool) -> None:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    seq_out = Shard(1) if sp else Replicate()
    plan: dict[str, Any] = {}
    if sm.embed is not None:
        plan["embed.tokens"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq_out)
        if sp and sm.embed.positions is not None:
            plan["embed.positions"] = SequenceParallel(use_local_output=True)
        sm.embed.seq_rank = tp_mesh.get_local_rank() if sp else 0
    for i, blk in sm.layers.items():
        p = f"layers.{i}"
        gated = getattr(blk.mlp, "gated", False)
        for name in ("q", "k", "v"):
            plan[f"{p}.attn.{name}"] = ColwiseParallel()
        plan[f"{p}.attn.o"] = RowwiseParallel(output_layouts=seq_out)
        for name in (("gate", "up") if gated else ("fc1",)):
            plan[f"{p}.mlp.{name}"] = ColwiseParallel()
        plan[f"{p}.mlp.{'down' if gated else 'fc2'}"] = RowwiseParallel(output_layouts=seq_out)
        if sp:
            plan[f"{p}.ln1"] = SequenceParallel()
            plan[f"{p}.ln2"] = SequenceParallel()
            for sub in ("attn", "mlp"):
                plan[f"{p}.{sub}"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                                        use_local_output=True)
    if sm.head is not None:
        if sp:
            plan["head.norm"] = SequenceParallel()
        plan["head.lm"] = ColwiseParallel(input_layouts=seq_out, output_layouts=Shard(-1), use_local_output=False)
    tied = sm.embed is not None and sm.head is not None and sm.head.lm.weight is sm.embed.tokens.weight
    parallelize_module(sm, tp_mesh, plan)
    if tied:
        assert sm.head is not None and sm.embed is not None
        sm.head.lm.weight = sm.embed.tokens.weight  # both Shard(0) over the vocabulary


def apply_dp(sm: StageModule, spec: RunSpec, dp_mesh: Any) -> nn.Module:
    """Data parallelism over ``dp_mesh``: FSDP2 per block (ZeRO-3 reshards after forward, ZeRO-2
    keeps the gathered weights until the block's backward) plus the stage as root (embedding,
    head; FSDP2 keeps the root's weights gathered for the whole step whatever it is told), DDP
    for ZeRO-0/1, ``replicate`` when the parameters are TP DTensors."""
    if spec.dp == 1:
        return sm
    if spec.sharded:
        from torch.distributed.fsdp import fully_shard

        for name, blk in sm.layers.items():
            fully_shard(blk, mesh=dp_mesh, reshard_after_forward=spec.block_zero(int(name)) == 3)
        first = min(int(n) for n in sm.layers)
        fully_shard(sm, mesh=dp_mesh, reshard_after_forward=spec.block_zero(first) == 3)
        return sm
    if spec.tp > 1:
        # DDP rejects DTensor parameters (no sharding rule for c10d.broadcast_); replicate is
        # PyTorch's data parallelism for TP modules (FSDP2 machinery with a shard group of one).
        from torch.distributed._composable.replicate_with_fsdp import replicate

        for blk in sm.layers.values():
            replicate(blk, mesh=dp_mesh)
        replicate(sm, mesh=dp_mesh)
        return sm
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(sm, process_group=dp_mesh.get_group(), gradient_as_bucket_view=True)

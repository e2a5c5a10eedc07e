"""nanotron's own rules: what Hugging Face's nanotron trainer holds that the other runtimes do not,
and how it splits a model into pipeline stages.

Read from nanotron's code as the Ultra-Scale Playbook's benchmarks ran it (docs/nanotron.md pins the
commit). nanotron's Llama follows Megatron-LM (merged ``qkv_proj`` and ``gate_up_proj``, flash
attention, a fused RMSNorm, Megatron-style tensor and sequence parallelism, Megatron-LM's vocabulary-
parallel cross entropy in fp32), so its activations and loss are priced with Megatron-LM's rules; the
differences are in the runtime ``nanotron`` (:class:`~parplan.solver.cost.runtime.Runtime`), one rule
in one place each:

- gradients accumulate in fp32 (``optimizer.accumulate_grad_in_fp32``): ``FP32GradientAccumulator``
  keeps an fp32 gradient buffer for every parameter, never sharded, even under ZeRO-1
  (``optim/gradient_accumulator.py``: "keep grad buffers for all parameters even when Zero 1 is
  used"), and an fp32 copy of the weights the optimizer updates (sharded by ZeRO-1 with Adam's moments:
  ``ZeroDistributedOptimizer`` builds the accumulator over the rank's slices): 2 + 4 + 12/N_d bytes a
  parameter, as Megatron-LM's distributed optimizer;
- data parallelism is PyTorch's DDP (``trainer.py``: ``DistributedDataParallel(model, bucket_cap_mb=
  ddp_bucket_cap_mb)``, no ``gradient_as_bucket_view``) whose communication hook adds each bucket into
  the fp32 buffer: the buckets are a resident copy of every gradient in the compute type
  (:attr:`~parplan.solver.cost.runtime.DataParallelBuffers.bucket_copy`);
- every micro-batch's backward makes autograd's ``param.grad`` in the compute type, which
  ``FP32GradientAccumulator.backward`` adds into the fp32 buffer and sets to None after
  ``loss.backward()`` returns (:attr:`~parplan.solver.cost.runtime.Runtime.grads_each_microbatch`);
- its matmuls are PyTorch's: cuBLAS's two workspaces are held as under the torch runtime;
- pipelining: ``OneForwardOneBackwardPipelineEngine`` runs ``pp - rank - 1`` warm-up forwards (the
  in-flight micro-batches of Megatron-LM's 1F1B), ``AllForwardAllBackwardPipelineEngine`` all of them
  (GPipe); a sent activation is not kept after the send (``SendTensorToPipelineBuffer`` saves none);
- stages: :func:`nanotron_partition`.

Not priced (small beside the rules above): DDP's bucket rebuild in the second step (it holds less
than the end of a backward, where every compute-type gradient is alive), the all-gather of the
updated weights under ZeRO-1, the dataloader's and NCCL's buffers.
"""

from __future__ import annotations

from itertools import accumulate
from typing import TYPE_CHECKING

from parplan.solver.errors import StrategyError

if TYPE_CHECKING:
    from parplan.solver.frontends.config import TransformerConfig


def nanotron_partition(layers: int, hidden: int, heads: int, ffn: int, vocab: int, pp: int) -> tuple[int, ...]:
    """Decoder layers on each of ``pp`` pipeline ranks as nanotron places them (``models/base.py``
    ``build_model``): its pipeline blocks in order (the embedding, ``layers`` decoder layers, the final
    norm, the LM head, the loss) cost ``4·heads·head_dim·hidden + 3·ffn·hidden`` a decoder layer and
    ``vocab·hidden`` the LM head (``LlamaModel.get_block_compute_costs``), the others nothing; a block
    goes to the current rank, which moves on once the running cost passes ``total·(rank + 1)/pp``.
    Ranks can be left without a decoder layer (the LM head alone, or nothing)."""
    head_dim = hidden // heads
    layer_cost = 4 * heads * head_dim * hidden + 3 * ffn * hidden
    costs = [0] + [layer_cost] * layers + [0, vocab * hidden, 0, 0]
    running = list(accumulate(costs))
    thresholds = [running[-1] * (r + 1) / pp for r in range(pp)]
    counts = [0] * pp
    rank = 0
    for i, cum in enumerate(running):
        if 1 <= i <= layers:
            counts[rank] += 1
        if cum > thresholds[rank]:
            rank += 1
    return tuple(counts)


def partition_of(config: TransformerConfig | None, pp: int) -> tuple[int, ...] | None:
    """The layers nanotron gives each of ``pp`` ranks for a Llama ``config`` (None without pipelining);
    StrategyError for a model nanotron does not split (an operator graph, no Llama) or a split that
    leaves a rank without a decoder layer (not modelled)."""
    if pp == 1:
        return None
    if config is None or config.family != "llama":
        raise StrategyError("nanotron's pipeline split is known for its Llama only")
    part = nanotron_partition(config.layers, config.hidden, config.heads, config.ffn, config.vocab, pp)
    if 0 in part:
        raise StrategyError(f"nanotron places the layers {list(part)} on the pipeline ranks: a rank without a "
                            "decoder layer is not modelled")
    return part


__all__ = ["nanotron_partition", "partition_of"]

"""The training framework a plan runs on, where frameworks keep different buffers.

The cost model follows Megatron-LM by default. PyTorch's own distributed engine (DTensor tensor
and sequence parallelism, FSDP2), which the validation agent runs, keeps some buffers that
Megatron-LM frees or never makes; each rule below was found by the agent's measurements
(``tests/agent/test_agent_matrix.py``) and is applied only for that runtime:

- sequence parallelism: a column-parallel linear saves the all-gathered (full-sequence) input it
  receives, where Megatron-LM saves the sharded one and gathers it again in backward;
- a vocabulary-parallel embedding's backward makes the gradient of the whole table before keeping
  its own rows;
- on CPU, RMSNorm is a composite of eager operators that also saves the normalised input ``x·rstd``
  (the CUDA kernel saves ``x`` and ``rstd`` only);
- plain data parallelism of tensor-parallel modules: DDP rejects DTensor parameters, so PyTorch
  replicates them with ``replicate`` (FSDP2's machinery over a shard group of one), which keeps an
  unsharded copy of every parameter from its forward until its backward;
- pipelining: ``torch.distributed.pipelining`` keeps the output a stage sent for each micro-batch
  until that micro-batch's backward (Megatron-LM frees the output's data once it is sent), and
  allocates, before the step, a receive buffer for every micro-batch's input activation and output
  gradient (communication buffers: temporary); a received activation that the stage saves for
  backward stays in its buffer instead of counting again as an activation. Under its 1F1B
  schedule the handle of the first warm-up send lives until the steady phase ends and keeps that
  micro-batch's output alive after its backward: one more output on every stage but the last.
"""

from __future__ import annotations

from enum import StrEnum


class Runtime(StrEnum):
    """Which framework's buffers the memory model counts."""

    MEGATRON = "megatron"
    TORCH = "torch"  # PyTorch-native (DTensor TP/SP, FSDP2), CUDA kernels
    TORCH_CPU = "torch-cpu"  # the same with CPU kernels (the agent's gloo runs)

    @property
    def saves_gathered_sp_inputs(self) -> bool:
        return self is not Runtime.MEGATRON

    @property
    def full_embedding_gradient(self) -> bool:
        return self is not Runtime.MEGATRON

    @property
    def rmsnorm_saves_normalized(self) -> bool:
        return self is Runtime.TORCH_CPU

    @property
    def holds_stage_outputs(self) -> bool:
        return self is not Runtime.MEGATRON

    def keeps_parameter_copy(self, tp: int, dp: int, zero: int) -> bool:
        """Whether data parallelism keeps a second, unsharded copy of the parameters through the
        forward and backward passes (PyTorch's ``replicate`` of TP modules)."""
        return self is not Runtime.MEGATRON and tp > 1 and dp > 1 and zero == 0

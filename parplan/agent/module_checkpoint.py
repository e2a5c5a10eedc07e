"""Megatron-LM's per-module recomputation (``--recompute-granularity selective --recompute-modules``)
for the agent's blocks, the two ways ``megatron/core/transformer/transformer_layer.py`` checkpoints a
module:

- ``tensor_parallel.checkpoint`` (``core_attn``, ``mlp``): the module runs keeping nothing for
  backward but its inputs, and runs again in backward; here ``torch.utils.checkpoint``
  (non-reentrant), which keeps its inputs by reference and recomputes the module when its backward
  first needs a saved tensor;
- ``CheckpointWithoutOutput`` (``layernorm``; ``megatron/core/tensor_parallel/random.py``): the same,
  and once the next module consumed the output, ``discard_output_and_register_recompute`` frees the
  output's storage (``untyped_storage().resize_(0)``, the tensor's metadata kept for its readers'
  saved references) and hooks the recomputation on the gradient of that module's output: the hook
  runs the norm again with autograd on and refills the freed storage with the result (a storage copy,
  which leaves the readers' saved references valid, and the recomputed copy's storage freed: one copy
  alive, as Megatron-LM's ``share_storage`` of the recomputed output leaves it); the checkpoint's
  backward runs the recomputed output's graph.

The agent's norms draw no random numbers, so no RNG state is restored around the recomputation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from parplan.agent.memtrack import mark_activation


class _WithoutOutput(torch.autograd.Function):
    """Runs ``run`` without autograd and keeps only its input; backward runs the graph of the output
    :meth:`CheckpointWithoutOutput._recompute` rebuilt."""

    @staticmethod
    def forward(ctx: Any, run: Callable[[torch.Tensor], torch.Tensor], owner: CheckpointWithoutOutput,
                x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            out = run(x)
        ctx.save_for_backward(x)
        owner.ctx = ctx
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, torch.Tensor | None]:
        if ctx.rebuilt is None:
            raise RuntimeError("CheckpointWithoutOutput: the output was not recomputed before its backward")
        x, out = ctx.rebuilt
        ctx.rebuilt = None
        torch.autograd.backward(out, grad)  # the norm's weights accumulate their gradients, as in forward's graph
        return None, None, x.grad


class CheckpointWithoutOutput:
    """One use of Megatron-LM's ``CheckpointWithoutOutput`` (one tensor in, one out)."""

    def __init__(self) -> None:
        self.ctx: Any = None
        self.run: Callable[[torch.Tensor], torch.Tensor] | None = None
        self.output: torch.Tensor | None = None

    def checkpoint(self, run: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        self.run = run
        out: torch.Tensor = _WithoutOutput.apply(run, self, x)  # type: ignore[no-untyped-call]
        self.ctx.rebuilt = None
        self.output = out
        return out

    def discard_output_and_register_recompute(self, hook_tensor: torch.Tensor) -> None:
        """Free the output's storage; recompute it when ``hook_tensor``'s gradient arrives."""
        assert self.output is not None
        self.output.untyped_storage().resize_(0)
        if hook_tensor.requires_grad:
            hook_tensor.register_hook(self._recompute)  # type: ignore[no-untyped-call]

    def _recompute(self, grad: torch.Tensor) -> None:
        assert self.run is not None and self.output is not None
        (saved,) = self.ctx.saved_tensors
        x = saved.detach().requires_grad_(saved.requires_grad)
        with torch.enable_grad():
            out = self.run(x)
        with torch.no_grad():
            storage = self.output.untyped_storage()
            storage.resize_(out.untyped_storage().nbytes())
            storage.copy_(out.untyped_storage())
            # one copy lives, as Megatron-LM's storage sharing leaves it: the norm's backward reads its
            # input and statistics, never its output, whose data the readers now find in the refill
            out.untyped_storage().resize_(0)
        self.ctx.rebuilt = (x, out)
        self.run = self.output = self.ctx = None


def run_checkpointed(norm: nn.Module, module: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                     recompute_norm: bool, recompute_module: bool) -> torch.Tensor:
    """``module(norm(x))`` as ``TransformerLayer`` runs its attention or MLP half under a module set:
    the norm under ``CheckpointWithoutOutput`` (``layernorm``), the module under
    ``tensor_parallel.checkpoint`` (``mlp``), the norm's output freed once the module ran."""
    ckpt = CheckpointWithoutOutput() if recompute_norm else None
    y = ckpt.checkpoint(norm, x) if ckpt is not None else norm(x)
    if recompute_module:
        mark_activation(y)  # the checkpoint keeps its input for the recomputation
        out: torch.Tensor = checkpoint(module, y, use_reentrant=False)
    else:
        out = module(y)
    if ckpt is not None:
        ckpt.discard_output_and_register_recompute(out)
    return out

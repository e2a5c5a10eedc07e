"""The bytes a PyTorch ``cross_entropy`` backward makes per logit, measured against the rule
(:func:`~parplan.solver.cost.activations.loss_backward_bytes_per_logit`).

Oracle: PyTorch's own ``MemTracker`` (the agent's measurement) on CPU, around
``cross_entropy(x.float(), y)`` and its backward, for bf16 and fp32 logits ``x``: the peak above the
logits themselves is the saved fp32 log-probabilities plus what the backward makes at once. Autograd
gives each gradient its input's dtype on every device, so the byte count holds on GPUs too."""

from __future__ import annotations

import pytest
import torch
from torch.distributed._tools.mem_tracker import MemTracker
from torch.nn import functional

from parplan.solver.cost.activations import LOSS_BYTES, loss_backward_bytes_per_logit
from parplan.solver.cost.runtime import Runtime

TOKENS, VOCAB = 1024, 4096


def _measured_bytes_per_logit(dtype: torch.dtype) -> float:
    logits = torch.randn(TOKENS, VOCAB, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, VOCAB, (TOKENS,))
    tracker = MemTracker()
    tracker.track_external(logits)
    with tracker:
        functional.cross_entropy(logits.float(), labels).backward()
    peak = sum(v for dev in tracker.get_tracker_snapshot("peak").values() for k, v in dev.items() if k == "Total")
    assert logits.grad is not None and logits.grad.dtype == dtype  # cast back to the logits' type
    return (peak - logits.numel() * logits.element_size()) / logits.numel()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_pytorch_cross_entropy_on_cast_logits(dtype: torch.dtype) -> None:
    act = torch.tensor([], dtype=dtype).element_size()
    predicted = LOSS_BYTES + loss_backward_bytes_per_logit(Runtime.TORCH, False, act)  # saved + made at once
    assert _measured_bytes_per_logit(dtype) == pytest.approx(predicted, abs=0.01)


def test_fused_losses_make_the_gradient_in_the_compute_type() -> None:
    assert loss_backward_bytes_per_logit(Runtime.MEGATRON, True, 2) == 2
    assert loss_backward_bytes_per_logit(Runtime.NANOTRON, True, 2) == 2
    # DTensor's loss parallelism: two fp32 buffers besides the fp32 gradient
    assert loss_backward_bytes_per_logit(Runtime.TORCH, True, 2) == 12

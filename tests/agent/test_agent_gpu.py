"""One configuration on CUDA (NCCL, torch.cuda.max_memory_allocated); skipped without a GPU."""

from __future__ import annotations

import pytest
import torch

from parplan.agent.matrix import GPT_TINY
from parplan.agent.plans import spec_for
from parplan.agent.validate import run_and_compare
from parplan.solver.strategy import ParallelConfig


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (CI has none)")
def test_one_configuration_on_cuda() -> None:
    gpus = min(2, torch.cuda.device_count())
    spec = spec_for(GPT_TINY, ParallelConfig(tp=gpus, dp=1), None, shrink=False, timing_steps=2)
    result = run_and_compare([spec], "cuda")[0]
    assert result["correct"]
    for r in result["ranks"]:
        assert r["measured"]["peak_bytes"] > 0  # torch.cuda.max_memory_allocated of a whole step
        assert r["measured"]["tracker_peak_bytes"] > 0
        assert r["measured"]["breakdown"]["parameters"] == r["predicted"]["breakdown"]["parameters"]
    assert result["step_seconds"]["measured"] > 0

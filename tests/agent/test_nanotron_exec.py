"""nanotron's loss and run checks in the validation agent (parplan/agent/nanotron_exec.py)."""

from __future__ import annotations

from dataclasses import asdict

import pytest
import torch
import torch.nn.functional as nnf

from parplan.agent.matrix import GPT_TINY, LLAMA_TINY
from parplan.agent.nanotron_exec import fp32_loss
from parplan.agent.run_spec import RunSpec
from parplan.solver.errors import StrategyError
from parplan.solver.frontends.config import TransformerConfig


def test_fp32_loss_is_cross_entropy_and_its_gradient() -> None:
    # the oracle: PyTorch's cross_entropy on the same logits in fp64
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 11, generator=gen).to(torch.bfloat16).requires_grad_()
    labels = torch.randint(0, 11, (2, 5), generator=gen)
    loss = fp32_loss(logits, labels)
    assert loss.dtype == torch.float32
    loss.backward()  # type: ignore[no-untyped-call]
    ref_logits = logits.detach().double().requires_grad_()
    ref = nnf.cross_entropy(ref_logits.flatten(0, 1), labels.flatten(0, 1))
    ref.backward()  # type: ignore[no-untyped-call]
    assert abs(float(loss.detach()) - float(ref.detach())) < 1e-5
    assert logits.grad is not None and ref_logits.grad is not None
    assert logits.grad.dtype == torch.bfloat16
    torch.testing.assert_close(logits.grad.double(), ref_logits.grad, rtol=1e-2, atol=1e-4)


@pytest.mark.parametrize(("model", "fields", "match"), [
    (LLAMA_TINY, {"tp": 2, "dp": 2}, "data parallelism"),
    (LLAMA_TINY, {"dp": 2, "zero": 1}, "data parallelism"),
    (GPT_TINY, {"dp": 2}, "data parallelism"),
    (LLAMA_TINY, {"dp": 2, "recompute": "selective"}, "whole blocks"),
])
def test_what_the_nanotron_trainer_does_not_run_is_one_line(model: TransformerConfig, fields: dict[str, object],
                                                             match: str) -> None:
    spec = RunSpec(model=asdict(model), trainer="nanotron", **fields)  # type: ignore[arg-type]
    with pytest.raises(StrategyError, match=match):
        spec.validate()


def test_nanotron_runs_and_is_predicted_in_bf16() -> None:
    spec = RunSpec(model=asdict(LLAMA_TINY), dp=2, trainer="nanotron")
    spec.validate()
    assert spec.precision == "bf16" and RunSpec(model=asdict(LLAMA_TINY)).precision == "fp32"

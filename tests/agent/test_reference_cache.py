"""The single-process reference a spec's check compares against is computed once per process for
each model, seed and batch (the matrix's strategies of one model share it), and equals a fresh one."""

from __future__ import annotations

import pytest
import torch

from parplan.agent import runner as executor
from parplan.agent.matrix import GPT_TINY
from parplan.agent.runner import reference, reference_for
from parplan.solver.frontends.config import TransformerConfig


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randint(0, GPT_TINY.vocab, (2, 16), generator=gen),
            torch.randint(0, GPT_TINY.vocab, (2, 16), generator=gen))


def test_one_reference_per_model_seed_and_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = GPT_TINY.with_(layers=1, seq_len=16)
    calls: list[int] = []

    def counted(cfg: TransformerConfig, tokens: torch.Tensor, labels: torch.Tensor, seed: int) -> executor.Reference:
        calls.append(1)
        return reference(cfg, tokens, labels, seed)

    monkeypatch.setattr(executor, "reference", counted)
    monkeypatch.setattr(executor, "_REFERENCES", {})
    tokens, labels = _batch(1)
    first = reference_for(cfg, tokens, labels, 0)
    assert reference_for(cfg, tokens.clone(), labels.clone(), 0) is first  # same contents: no new run
    assert len(calls) == 1
    other_batch = reference_for(cfg, *_batch(2), 0)
    other_seed = reference_for(cfg, tokens, labels, 1)
    other_model = reference_for(cfg.with_(hidden=128), tokens, labels, 0)
    assert len(calls) == 4
    assert len({id(first), id(other_batch), id(other_seed), id(other_model)}) == 4

    fresh = reference(cfg, tokens, labels, 0)
    assert first.loss == fresh.loss and first.loss_after_step == fresh.loss_after_step
    assert first.grads.keys() == fresh.grads.keys()
    assert all(torch.equal(first.grads[k], fresh.grads[k]) for k in fresh.grads)
    assert all(g.device.type == "cpu" for g in first.grads.values())

"""Megatron-LM's per-module recomputation in the agent's blocks (:mod:`parplan.agent.module_checkpoint`),
in one process: ``CheckpointWithoutOutput`` frees its output's storage once the next module ran and
refills it in backward, and every module set gives the gradients of the run without recomputation."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from parplan.agent.matrix import GPT_TINY, LLAMA_TINY
from parplan.agent.model import Block, build_model, set_dropout, set_recompute
from parplan.agent.module_checkpoint import CheckpointWithoutOutput
from parplan.solver.frontends.config import TransformerConfig


def test_the_output_storage_is_freed_after_its_consumer_and_refilled_in_backward() -> None:
    torch.manual_seed(0)
    norm, lin = nn.LayerNorm(16), nn.Linear(16, 8)
    x = torch.randn(4, 16, requires_grad=True)
    ref = lin(norm(x)).square().sum()
    ref.backward()
    expected = [t.grad.clone() for t in (x, norm.weight, norm.bias, lin.weight)]  # type: ignore[union-attr]
    for t in (x, norm.weight, norm.bias, lin.weight):
        t.grad = None
    ckpt = CheckpointWithoutOutput()
    y = ckpt.checkpoint(norm, x)
    z = lin(y)
    ckpt.discard_output_and_register_recompute(z)
    assert y.untyped_storage().nbytes() == 0  # the linear's saved input is gone until backward
    z.square().sum().backward()
    assert y.untyped_storage().nbytes() == 4 * 16 * 4
    assert torch.equal(y.detach(), norm(x).detach())
    for t, g in zip((x, norm.weight, norm.bias, lin.weight), expected, strict=True):
        assert torch.allclose(t.grad, g, rtol=1e-6, atol=1e-7)  # type: ignore[arg-type]


@pytest.mark.parametrize("cfg", [GPT_TINY, LLAMA_TINY], ids=lambda c: c.name)
@pytest.mark.parametrize("policy", ["selective:mlp", "selective:layernorm", "selective:core_attn+layernorm+mlp"])
def test_module_sets_keep_the_loss_and_gradients(cfg: TransformerConfig, policy: str) -> None:
    tokens = torch.randint(0, cfg.vocab, (2, 32), generator=torch.Generator().manual_seed(1))
    labels = torch.roll(tokens, -1, 1)
    grads = []
    for rec in ("none", policy):
        model = build_model(cfg.with_(layers=2), seed=3)
        set_dropout(model, False)
        set_recompute(model, rec)
        loss = model(tokens, labels)
        loss.backward()
        grads.append((float(loss.detach()), {n: p.grad.clone() for n, p in model.named_parameters()}))  # type: ignore[union-attr]
    blk = model.layers["0"]
    assert isinstance(blk, Block) and blk.recompute_mlp == ("mlp" in policy)
    assert blk.recompute_norms == ("layernorm" in policy) and blk.attn.recompute_core == ("core_attn" in policy)
    (l0, g0), (l1, g1) = grads
    assert l1 == pytest.approx(l0, rel=1e-6)
    assert g0.keys() == g1.keys()
    for name in g0:
        assert torch.allclose(g1[name], g0[name], rtol=1e-4, atol=1e-6), name

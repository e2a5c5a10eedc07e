"""A model's dropout (``TransformerConfig.dropout``): 0.1 for GPT unless set, none for Llama unless
set, and what it adds to the activations is Korthikanti et al.'s count (Reducing Activation
Recomputation, 2022, section 4.1): a 1-byte mask per element after the embedding, after the
attention's output projection and after the MLP; without flash attention also the attention
probabilities' mask (1 byte) and their dropped copy (2 bytes, PV's input), ``3 a s^2 b`` a layer."""

from __future__ import annotations

import pytest

from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.plan_memory import plan_memory
from parplan.solver.errors import ConfigError
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.config import TransformerConfig, architecture_dropout
from parplan.solver.ir import OpKind
from parplan.solver.strategy import ParallelConfig

LAYERS, HIDDEN, HEADS, SEQ, BATCH = 2, 256, 4, 128, 2


def _activations(family: str, dropout: float | None, flash: bool) -> float:
    cfg = TransformerConfig(family, "t", LAYERS, HIDDEN, HEADS, 4 * HIDDEN, 512, SEQ, dropout=dropout)  # type: ignore[arg-type]
    plan = ParallelConfig(recompute=Recompute.NONE, micro_batch=BATCH, flash_attention=flash)
    return plan_memory(build_graph(cfg, batch=BATCH), plan).stages[0].memory.bytes.activations


@pytest.mark.parametrize(("family", "default"), [("gpt", 0.1), ("llama", 0.0), ("bert", 0.1), ("vit", 0.0)])
def test_the_familys_usual_dropout_unless_set(family: str, default: float) -> None:
    assert architecture_dropout({"family": family}) == default
    assert architecture_dropout({"family": family, "dropout": 0.0}) == 0.0


@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_a_dropout_adds_its_masks(family: str) -> None:
    hidden_masks = (2 * LAYERS + 1) * BATCH * SEQ * HIDDEN  # bytes
    scores = LAYERS * BATCH * HEADS * SEQ * SEQ
    assert _activations(family, 0.1, True) - _activations(family, 0.0, True) == hidden_masks
    assert _activations(family, 0.1, False) - _activations(family, 0.0, False) == hidden_masks + 3 * scores
    # only whether there is one counts, not its probability
    assert _activations(family, 0.3, True) == _activations(family, 0.1, True)


def test_the_graph_has_a_dropout_only_where_the_model_does() -> None:
    def dropouts(family: str, p: float | None) -> int:
        cfg = TransformerConfig(family, "t", LAYERS, HIDDEN, HEADS, 4 * HIDDEN, 512, SEQ, dropout=p)  # type: ignore[arg-type]
        return sum(1 for n in build_graph(cfg).nodes if n.kind is OpKind.DROPOUT)

    assert dropouts("gpt", None) == dropouts("llama", 0.1) == 2 * LAYERS + 1
    assert dropouts("gpt", 0.0) == dropouts("llama", None) == 0


@pytest.mark.parametrize("mla", [False, True])
def test_the_attention_probabilities_drop_out_with_the_models_dropout(mla: bool) -> None:
    """Multi-head latent attention's core too (DeepSeek-style, a latent of 64)."""
    latent = {"kv_lora_rank": 64, "qk_rope_dim": 16, "v_head_dim": 64} if mla else {}
    for p, expected in ((None, 0.0), (0.1, 0.1)):
        cfg = TransformerConfig("llama", "t", LAYERS, HIDDEN, HEADS, 4 * HIDDEN, 512, SEQ, dropout=p, **latent)
        cores = [n for n in build_graph(cfg).nodes if n.kind is OpKind.ATTENTION]
        assert len(cores) == LAYERS and all(n.attrs["dropout"] == expected for n in cores)


@pytest.mark.parametrize(("family", "p", "why"), [("gpt", 1.0, "in \\[0, 1\\)"), ("llama", -0.1, "in \\[0, 1\\)"),
                                                  ("vit", 0.1, "no dropout")])
def test_an_impossible_dropout_is_refused(family: str, p: float, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        TransformerConfig(family, "t", LAYERS, HIDDEN, HEADS, 4 * HIDDEN, 512, SEQ, dropout=p)  # type: ignore[arg-type]


def test_only_megatrons_export_writes_a_dropout_set_in_the_architecture() -> None:
    """Megatron-LM's arguments carry the model's dropout (its own default, 0.1, would add masks a
    Llama plan does not count); the other trainers' exports would launch another model."""
    from parplan.exports.common import unwritten_features

    arch = {"family": "llama", "dropout": 0.1}
    assert unwritten_features(arch, "megatron") == []
    assert any("dropout" in why for why in unwritten_features(arch, "torchtitan"))
    assert unwritten_features({"family": "llama"}, "torchtitan") == []


def test_the_agent_builds_dropout_into_gpt_models_only() -> None:
    pytest.importorskip("torch")
    from parplan.agent.model import check_supported

    check_supported(TransformerConfig("gpt", "t", 2, 256, 4, 1024, 512, 128, dropout=0.0))
    with pytest.raises(ConfigError, match="dropout"):
        check_supported(TransformerConfig("llama", "t", 2, 256, 4, 1024, 512, 128, dropout=0.1))

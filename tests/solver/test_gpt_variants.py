"""GPT, Llama and Mixtral with any normalisation, position embedding and linear biases (Megatron-LM's
``--normalization``, ``--position-embedding-type``, ``--disable-bias-linear``).

Oracles: the parameter count written out from Megatron-LM's layer definitions
(``megatron/core/models/gpt/gpt_layer_specs.py``: ``input_layernorm``, ``linear_qkv``, ``linear_proj``,
``pre_mlp_layernorm``, ``linear_fc1``, ``linear_fc2``, ``final_layernorm``; ``LanguageModelEmbedding``'s
word and position tables); megatron-core's own ``GPTModel`` built on the CPU from the same flags; and
Korthikanti et al.'s per-layer activations ``sbh(34 + 5as/h)``, whose terms none of the three choices
changes in Megatron-LM (LayerNorm and RMSNorm both keep their input and a value a row; rotary positions
keep only the shared cosine/sine tables; a bias adds no saved tensor).
"""

from __future__ import annotations

import itertools
import os
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from parplan.imports.megatron import read_megatron_args
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.plan_memory import plan_memory
from parplan.solver.errors import ConfigError
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.strategy import ParallelConfig

L, H, A, F, V, S = 3, 64, 4, 256, 128, 32
VARIANTS = list(itertools.product(["layernorm", "rmsnorm"], ["learned", "rope", "none"], [True, False]))


def _gpt(norm: str, positions: str, bias: bool, **kw: Any) -> TransformerConfig:
    return TransformerConfig("gpt", "gpt-variant", L, H, A, F, V, S, norm=norm, positions=positions,  # type: ignore[arg-type]
                             linear_bias=bias, **kw)


def _closed_form(norm: str, positions: str, bias: bool, qk_norm: bool = False) -> int:
    """Megatron-LM's GPT: word embeddings V·h (tied to the output layer), a position table S·h when
    learned; per layer two norms (LayerNorm: weight and bias, RMSNorm: weight), linear_qkv 3h² (+3h),
    linear_proj h² (+h), linear_fc1 hf (+f), linear_fc2 fh (+h), with --qk-layernorm a norm of the
    head dim for q and one for k; the final norm."""
    per_norm = 2 if norm == "layernorm" else 1
    d = H // A
    layer = 2 * per_norm * H + 3 * H * H + H * H + 2 * H * F
    layer += (3 * H + H + F + H) if bias else 0
    layer += 2 * per_norm * d if qk_norm else 0
    return V * H + (S * H if positions == "learned" else 0) + L * layer + per_norm * H


@pytest.mark.parametrize(("norm", "positions", "bias"), VARIANTS)
def test_parameters_are_megatron_lms_layer_definitions(norm: str, positions: str, bias: bool) -> None:
    graph = build_graph(_gpt(norm, positions, bias), batch=1, seq_len=S)
    assert graph.parameter_count() == _closed_form(norm, positions, bias)
    names = {n.id for n in graph.nodes if n.is_parameter}
    assert ("embed.positions.weight" in names) == (positions == "learned")
    assert ("layers.0.ln1.bias" in names) == (norm == "layernorm")
    assert ("layers.0.mlp.fc1.bias" in names) == bias


def test_q_and_k_norms_take_the_models_normalisation() -> None:
    for norm in ("layernorm", "rmsnorm"):
        graph = build_graph(_gpt(norm, "rope", False, qk_norm=True), batch=1, seq_len=S)
        assert graph.parameter_count() == _closed_form(norm, "rope", False, qk_norm=True)


def test_the_familys_own_choices_are_the_defaults() -> None:
    """A GPT's LayerNorm, learned positions and biases; a Llama's RMSNorm, RoPE and none: the same
    graph with the fields unset as with them set to the family's own."""
    gpt = TransformerConfig("gpt", "g", L, H, A, F, V, S)
    assert (gpt.norm_kind, gpt.position_kind, gpt.linear_biases) == ("layernorm", "learned", True)
    assert build_graph(gpt).nodes == build_graph(gpt.with_(norm="layernorm", positions="learned",
                                                           linear_bias=True)).nodes
    llama = TransformerConfig("llama", "l", L, H, A, F, V, S)
    assert (llama.norm_kind, llama.position_kind, llama.linear_biases) == ("rmsnorm", "rope", False)


@pytest.mark.parametrize(("fields", "why"), [
    ({"norm": "batchnorm"}, "norm must be layernorm or rmsnorm"),
    ({"positions": "alibi"}, "positions must be learned, rope or none"),
    ({"family": "bert", "norm": "rmsnorm"}, "apply to gpt, llama and mixtral models only"),
    ({"family": "t5", "decoder_layers": 2, "linear_bias": True}, "apply to gpt, llama and mixtral models only"),
    ({"family": "vit", "vocab": 0, "positions": "rope"}, "apply to gpt, llama and mixtral models only"),
    ({"family": "llama", "kv_lora_rank": 16, "qk_rope_dim": 8, "v_head_dim": 16, "linear_bias": True},
     "multi-head latent attention has no q/k/v biases"),
])
def test_invalid_choices_are_refused(fields: dict[str, Any], why: str) -> None:
    base: dict[str, Any] = {"family": "gpt", "name": "x", "layers": L, "hidden": H, "heads": A, "ffn": F, "vocab": V}
    with pytest.raises(ConfigError, match=why):
        TransformerConfig(**(base | fields))


def test_only_learned_positions_bound_the_sequence() -> None:
    with pytest.raises(ConfigError, match="learned positions"):
        build_graph(_gpt("layernorm", "learned", True), seq_len=2 * S)
    build_graph(_gpt("layernorm", "rope", True), seq_len=2 * S)
    with pytest.raises(ConfigError, match="learned positions"):
        build_graph(TransformerConfig("llama", "l", L, H, A, F, V, S, positions="learned"), seq_len=2 * S)


def _per_layer_activation_bytes(cfg: TransformerConfig, b: int, par: ParallelConfig) -> float:
    small = plan_memory(build_graph(cfg, batch=b), par).stages[0].activation_bytes_per_microbatch
    large = plan_memory(build_graph(cfg.with_(layers=cfg.layers + 1), batch=b), par)
    return large.stages[0].activation_bytes_per_microbatch - small


@pytest.mark.parametrize(("norm", "positions", "bias"), [("rmsnorm", "rope", False), ("layernorm", "none", False),
                                                         ("rmsnorm", "learned", True)])
@pytest.mark.parametrize(("t", "sp"), [(1, False), (2, True)])
def test_korthikanti_sbh_34_plus_5as_over_h_holds_for_every_variant(norm: str, positions: str, bias: bool, t: int,
                                                                    sp: bool) -> None:
    s, b = S, 2
    par = ParallelConfig(tp=t, sequence_parallel=sp, recompute=Recompute.NONE, flash_attention=False)
    expected = s * b * H / t * (34 + 5 * A * s / H) if sp else s * b * H * (10 + 24 / t + 5 * A * s / (H * t))
    got = _per_layer_activation_bytes(_gpt(norm, positions, bias), b, par)
    assert got == pytest.approx(expected, rel=1e-12)


# ---------------------------------------------------------------- megatron-core's own GPTModel

#: flags of Megatron-LM's CI GPTs this shape takes (tests/functional_tests/test_cases/gpt/*: rope_embeddings,
#: disable_bias_linear, qk_layernorm, swiglu, the fp8 tp_overlap cases' RMSNorm), and two more combinations
CI_FLAGS = [
    "--position-embedding-type rope",
    "--disable-bias-linear",
    "--qk-layernorm",
    "--normalization RMSNorm",
    "--swiglu",
    "--normalization RMSNorm --position-embedding-type none --disable-bias-linear --add-qkv-bias",
    "--swiglu --normalization LayerNorm --position-embedding-type rope --disable-bias-linear --qk-layernorm",
]


@pytest.fixture(scope="module")
def megatron_core() -> Iterator[Any]:
    """megatron-core with one CPU process as its whole world (gloo)."""
    pytest.importorskip("megatron.core", reason="the exports extra (megatron-core) is not installed")
    import torch.distributed as dist
    from megatron.core import parallel_state

    started = not dist.is_initialized()
    if started:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29517")
        dist.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    yield parallel_state
    parallel_state.destroy_model_parallel()
    if started:
        dist.destroy_process_group()


def _megatron_parameters(flags: str) -> int:
    """The parameters of megatron-core's GPTModel (local layer spec, embeddings tied) built from ``flags``."""
    import torch.nn.functional as nnf
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig as McoreConfig

    words = flags.split()
    value = {w: words[i + 1] for i, w in enumerate(words[:-1]) if not words[i + 1].startswith("--")}
    norm = value.get("--normalization", "LayerNorm")
    swiglu = "--swiglu" in words
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = McoreConfig(num_layers=L, hidden_size=H, num_attention_heads=A, ffn_hidden_size=F, normalization=norm,
                          add_bias_linear="--disable-bias-linear" not in words, add_qkv_bias="--add-qkv-bias" in words,
                          qk_layernorm="--qk-layernorm" in words, gated_linear_unit=swiglu,
                          activation_func=nnf.silu if swiglu else nnf.gelu, use_cpu_initialization=True)
        model = GPTModel(cfg, get_gpt_layer_local_spec(normalization=norm, qk_layernorm=cfg.qk_layernorm),
                         vocab_size=V, max_sequence_length=S, share_embeddings_and_output_weights=True,
                         position_embedding_type=value.get("--position-embedding-type", "learned_absolute"))
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("flags", CI_FLAGS)
def test_the_import_builds_megatron_cores_model(flags: str, megatron_core: Any) -> None:
    text = (f"--num-layers {L} --hidden-size {H} --num-attention-heads {A} --ffn-hidden-size {F} --seq-length {S} "
            f"--max-position-embeddings {S} --vocab-size {V} --micro-batch-size 1 --bf16 {flags}")
    model = read_megatron_args(text, gpus=1).model
    assert model is not None
    assert model.parameter_count() == _megatron_parameters(flags)

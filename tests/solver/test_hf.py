"""Hugging Face config.json import: field mapping, defaults and errors."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from parplan.solver.errors import ConfigError
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.frontends.hf import config_from_hf, load_hf_config, supported_model_types
from parplan.solver.frontends.presets import get_preset

FIXTURES = Path(__file__).resolve().parent.parent / "data" / "hf"


def fixture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return data


# fixture: expected fields (those not listed keep TransformerConfig's defaults, checked below)
EXPECTED: dict[str, dict[str, Any]] = {
    "gpt2": {
        "family": "gpt",
        "layers": 12,
        "hidden": 768,
        "heads": 12,
        "ffn": 3072,
        "vocab": 50257,
        "seq_len": 1024,
        "kv_heads": None,
        "head_dim": None,
        "tied_embeddings": True,
    },
    "llama": {
        "family": "llama",
        "name": "meta-llama/Llama-2-7b-hf",
        "layers": 32,
        "hidden": 4096,
        "heads": 32,
        "kv_heads": 32,
        "head_dim": None,
        "ffn": 11008,
        "vocab": 32000,
        "seq_len": 4096,
        "tied_embeddings": False,
    },
    "mistral": {
        "family": "llama",
        "layers": 32,
        "hidden": 4096,
        "heads": 32,
        "kv_heads": 8,
        "head_dim": None,
        "ffn": 14336,
        "vocab": 32000,
        "seq_len": 32768,
        "tied_embeddings": False,
    },
    "qwen2": {
        "family": "llama",
        "name": "Qwen/Qwen2.5-7B",
        "layers": 28,
        "hidden": 3584,
        "heads": 28,
        "kv_heads": 4,
        "head_dim": None,
        "ffn": 18944,
        "vocab": 152064,
        "seq_len": 131072,
        "tied_embeddings": False,
        "qkv_bias": True,
        "qk_norm": False,
    },
    "qwen3": {
        "family": "llama",
        "name": "Qwen/Qwen3-32B",
        "layers": 64,
        "hidden": 5120,
        "heads": 64,
        "kv_heads": 8,
        "head_dim": 128,
        "ffn": 25600,
        "vocab": 151936,
        "seq_len": 40960,
        "tied_embeddings": False,
        "qkv_bias": False,
        "qk_norm": True,
    },
    "bert": {
        "family": "bert",
        "layers": 24,
        "hidden": 1024,
        "heads": 16,
        "ffn": 4096,
        "vocab": 30522,
        "seq_len": 512,
        "type_vocab": 2,
        "tied_embeddings": True,
    },
    "t5": {
        "family": "t5",
        "layers": 24,
        "decoder_layers": 24,
        "hidden": 1024,
        "heads": 128,
        "head_dim": 128,
        "ffn": 65536,
        "vocab": 32128,
        "seq_len": 512,
        "tied_embeddings": True,
        "gated_mlp": False,
        "relative_buckets": 32,
    },
    "vit": {
        "family": "vit",
        "layers": 32,
        "hidden": 1280,
        "heads": 16,
        "ffn": 5120,
        "vocab": 0,
        "seq_len": 257,
        "image_size": 224,
        "patch_size": 14,
        "channels": 3,
        "num_classes": 1000,
    },
    "mixtral": {
        "family": "mixtral",
        "layers": 32,
        "hidden": 4096,
        "heads": 32,
        "kv_heads": 8,
        "head_dim": None,
        "ffn": 14336,
        "vocab": 32000,
        "seq_len": 32768,
        "tied_embeddings": False,
        "num_experts": 8,
        "top_k": 2,
    },
}


@pytest.mark.parametrize("fx", sorted(EXPECTED))
def test_fixture_maps_to_expected_fields(fx: str) -> None:
    got = load_hf_config(FIXTURES / f"{fx}.json")
    want = dict(EXPECTED[fx])
    want.setdefault("name", fx)  # no _name_or_path: file stem
    defaults = {f.name: f.default for f in dataclasses.fields(TransformerConfig) if f.name not in want}
    assert {k: getattr(got, k) for k in want} == want
    # every other field keeps its default, except fields the family sets itself
    assert {k: getattr(got, k) for k in defaults} == defaults


def test_fixture_dicts_match_file_loading() -> None:
    for fx in EXPECTED:
        assert config_from_hf(fixture(fx), name="x") == load_hf_config(FIXTURES / f"{fx}.json", name="x")


def test_all_families_covered() -> None:
    assert set(supported_model_types()) == {"gpt2", "llama", "mistral", "bert", "t5", "vit", "mixtral", "qwen2",
                                            "qwen3"}


@pytest.mark.parametrize(
    ("fx", "preset", "seq_len"),
    [("llama", "llama-2-7b", None), ("mixtral", "mixtral-8x7b", 4096), ("qwen2", "qwen2.5-7b", 4096),
     ("qwen3", "qwen3-32b", 4096)],
)
def test_hf_equals_preset(fx: str, preset: str, seq_len: int | None) -> None:
    """The published HF configs give exactly the preset's config (Mixtral trains at 4096 by default)."""
    p = get_preset(preset)
    assert config_from_hf(fixture(fx), name=p.name, seq_len=seq_len) == p


def test_t5_and_vit_and_bert_fixtures_match_presets_in_shape() -> None:
    for fx, preset in [("t5", "t5-11b"), ("vit", "vit-huge"), ("bert", "bert-large")]:
        p = get_preset(preset)
        assert config_from_hf(fixture(fx), name=p.name) == p


def test_gpt2_n_inner_none_means_4h() -> None:
    cfg = fixture("gpt2")
    assert cfg["n_inner"] is None
    assert config_from_hf(cfg).ffn == 4 * 768
    del cfg["n_inner"]
    assert config_from_hf(cfg).ffn == 4 * 768
    cfg["n_inner"] = 1000
    assert config_from_hf(cfg).ffn == 1000


def test_mistral_sliding_window_is_ignored() -> None:
    cfg = fixture("mistral")
    base = config_from_hf(cfg)
    for window in (None, 128, 4096, 10**6):
        cfg["sliding_window"] = window
        assert config_from_hf(cfg) == base
    assert base.seq_len == 32768  # the config's maximum, not the window


def test_seq_len_override() -> None:
    assert config_from_hf(fixture("mistral"), seq_len=2048).seq_len == 2048
    assert config_from_hf(fixture("gpt2"), seq_len=512).seq_len == 512
    with pytest.raises(ConfigError, match="seq_len"):
        config_from_hf(fixture("gpt2"), seq_len=0)


def test_name_resolution(tmp_path: Path) -> None:
    assert config_from_hf(fixture("gpt2")).name == "gpt2"
    assert config_from_hf(fixture("gpt2"), name="mine").name == "mine"
    assert config_from_hf(fixture("llama")).name == "meta-llama/Llama-2-7b-hf"
    d = tmp_path / "Some-Model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(fixture("gpt2")))
    assert load_hf_config(d / "config.json").name == "Some-Model"
    assert load_hf_config(str(d / "config.json"), name="n").name == "n"


def test_llama_defaults_and_explicit_head_dim() -> None:
    cfg = fixture("llama")
    del cfg["num_key_value_heads"], cfg["tie_word_embeddings"]
    got = config_from_hf(cfg)
    assert got.n_kv_heads == got.heads == 32
    assert got.tied_embeddings is False
    cfg["tie_word_embeddings"] = True
    assert config_from_hf(cfg).tied_embeddings is True
    cfg["head_dim"] = 256  # e.g. Gemma-style wide heads
    assert config_from_hf(cfg).d_head == 256
    cfg["head_dim"] = 128  # the default: normalised away so configs compare equal
    assert config_from_hf(cfg).head_dim is None
    cfg["head_dim"] = None
    assert config_from_hf(cfg).head_dim is None


@pytest.mark.parametrize(
    ("proj", "gated"), [("relu", False), ("gated-gelu", True), ("gelu", False), ("gated-silu", True)]
)
def test_t5_feed_forward_proj(proj: str, gated: bool) -> None:
    cfg = fixture("t5")
    cfg["feed_forward_proj"] = proj
    assert config_from_hf(cfg).gated_mlp is gated


def test_t5_decoder_layers_and_tie() -> None:
    cfg = fixture("t5")
    cfg["num_decoder_layers"] = 6
    cfg["tie_word_embeddings"] = False  # flan-t5 / t5 v1.1
    got = config_from_hf(cfg)
    assert (got.layers, got.decoder_layers, got.tied_embeddings) == (24, 6, False)
    cfg["feed_forward_proj"] = "swish-gated"
    with pytest.raises(ConfigError, match="feed_forward_proj"):
        config_from_hf(cfg)


def test_vit_num_labels_from_id2label() -> None:
    cfg = fixture("vit")
    cfg["id2label"] = {str(i): f"c{i}" for i in range(21843)}
    assert config_from_hf(cfg).num_classes == 21843
    cfg["image_size"], cfg["patch_size"] = 384, 16
    got = config_from_hf(cfg)
    assert (got.num_patches, got.tokens_per_sample, got.seq_len) == (576, 577, 577)


def test_architectures_hint_when_model_type_missing() -> None:
    for fx in EXPECTED:
        cfg = fixture(fx)
        want = config_from_hf(cfg, name="x")
        del cfg["model_type"]
        assert config_from_hf(cfg, name="x") == want, fx


REQUIRED = {
    "gpt2": ["n_embd", "n_layer", "n_head", "vocab_size", "n_positions"],
    "llama": [
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "vocab_size",
        "max_position_embeddings",
    ],
    "bert": [
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "vocab_size",
        "max_position_embeddings",
        "type_vocab_size",
    ],
    "t5": ["d_model", "d_ff", "num_heads", "d_kv", "num_layers", "vocab_size"],
    "vit": [
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "image_size",
        "patch_size",
    ],
    "mixtral": ["num_local_experts", "num_experts_per_tok", "hidden_size", "intermediate_size"],
}


@pytest.mark.parametrize(("fx", "field"), [(fx, f) for fx, fs in REQUIRED.items() for f in fs])
def test_missing_field_is_named(fx: str, field: str) -> None:
    cfg = fixture(fx)
    del cfg[field]
    with pytest.raises(ConfigError) as e:
        config_from_hf(cfg)
    assert field in str(e.value)
    assert cfg["model_type"] in str(e.value)


def test_missing_field_in_file_names_path(tmp_path: Path) -> None:
    cfg = fixture("bert")
    del cfg["hidden_size"]
    path = tmp_path / "bert.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="hidden_size") as e:
        load_hf_config(path)
    assert str(path) in str(e.value)


@pytest.mark.parametrize("bad", ["4096", 40.0, True, -1])
def test_wrong_field_type(bad: object) -> None:
    cfg = fixture("llama")
    cfg["hidden_size"] = bad
    with pytest.raises(ConfigError, match="hidden_size"):
        config_from_hf(cfg)


def test_unknown_model_type_lists_supported() -> None:
    with pytest.raises(ConfigError) as e:
        config_from_hf({"model_type": "mamba", "hidden_size": 768})
    msg = str(e.value)
    assert "mamba" in msg
    assert all(t in msg for t in supported_model_types())
    with pytest.raises(ConfigError, match="no model_type"):
        config_from_hf({"hidden_size": 768, "architectures": ["RobertaForMaskedLM"]})


def test_inconsistent_shapes_raise_config_error() -> None:
    cfg = fixture("llama")
    cfg["num_key_value_heads"] = 5  # does not divide 32
    with pytest.raises(ConfigError, match="kv_heads"):
        config_from_hf(cfg)
    cfg = fixture("vit")
    cfg["patch_size"] = 0
    with pytest.raises(ConfigError, match="patch_size"):
        config_from_hf(cfg)


@pytest.mark.parametrize("text", ["{not json", "", "[1, 2]", '"llama"'])
def test_bad_json_file(tmp_path: Path, text: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_hf_config(path)
    assert str(path) in str(e.value)


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_hf_config(tmp_path / "missing.json")
    path = tmp_path / "bin.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match=r"bin\.json"):
        load_hf_config(path)


def test_output_projection_bias_is_refused_by_name() -> None:
    """A Llama or Qwen3 config with ``attention_bias`` true biases the output projection too, which
    the graph does not model: one clear line, not a silently different model."""
    cfg = fixture("qwen3")
    cfg["attention_bias"] = True
    with pytest.raises(ConfigError, match="attention_bias"):
        config_from_hf(cfg)


def test_qwen_architectures_hint_when_model_type_missing() -> None:
    cfg = fixture("qwen2")
    del cfg["model_type"]
    assert config_from_hf(cfg).qkv_bias


def test_dropout_fields_are_read_the_largest_standing_for_all() -> None:
    """A config's own dropout: without it a GPT-2 trained with none would be priced with masks, and
    a Llama trained with attention dropout without them (an under-prediction)."""
    gpt2 = fixture("gpt2")
    assert config_from_hf(gpt2).dropout is None  # 0.1 everywhere: the family's usual
    none = {**gpt2, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    assert config_from_hf(none).dropout == 0.0
    assert config_from_hf({**none, "attn_pdrop": 0.2}).dropout == 0.2
    llama = fixture("llama")
    assert config_from_hf({**llama, "attention_dropout": 0.1}).dropout == 0.1
    assert config_from_hf({**llama, "attention_dropout": 0.0}).dropout is None
    with pytest.raises(ConfigError, match="ViT has no dropout"):  # refused, not priced without
        config_from_hf({**fixture("vit"), "hidden_dropout_prob": 0.1})
    assert config_from_hf({**fixture("t5"), "dropout_rate": 0.0}).dropout == 0.0
    for bad in (1.0, -0.1, "0.1", True):
        with pytest.raises(ConfigError, match="resid_pdrop"):
            config_from_hf({**gpt2, "resid_pdrop": bad})


def test_a_gpt2_without_dropout_prices_no_masks() -> None:
    from parplan.solver.cluster import make_cluster
    from parplan.solver.evaluate import evaluate
    from parplan.solver.models import ModelSource
    from parplan.solver.strategy import ParallelConfig

    gpt2 = fixture("gpt2")
    with_masks = config_from_hf(gpt2, seq_len=1024)
    without = config_from_hf({**gpt2, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}, seq_len=1024)
    cluster, strategy = make_cluster(1, 1, "A100-80GB"), ParallelConfig(micro_batch=4)
    a = evaluate(ModelSource(with_masks.name, config=with_masks), cluster, strategy).memory.stages[0]\
        .activation_bytes_per_microbatch
    b = evaluate(ModelSource(without.name, config=without), cluster, strategy).memory.stages[0]\
        .activation_bytes_per_microbatch
    # the embedding's dropout and each block's two (after attention, after the MLP) keep a one-byte
    # mask of a hidden state per token (the attention's own dropout runs in the flash kernel: no mask)
    assert a - b == (2 * with_masks.layers + 1) * 4 * 1024 * with_masks.hidden

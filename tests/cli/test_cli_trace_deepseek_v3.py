"""A traced DeepSeek-V3 (multi-head latent attention whose queries and keys are 48 wide, 32 + 16
rotary, and values 32; a dense first layer, then 8 routed experts and a shared one) plans end to end.
Oracles: the parameters of the model transformers builds, and their shards under Megatron-LM's
layout read from the parameters' module names (not from parplan's graph)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from parplan.cli import main  # noqa: E402
from parplan.solver.frontends.builder import build_graph  # noqa: E402
from parplan.solver.frontends.presets import get_preset  # noqa: E402
from parplan.solver.ir import OpKind  # noqa: E402
from parplan.solver.strategy import SplitDims  # noqa: E402
from parplan.solver.wire import graph_from_json  # noqa: E402

CONFIG = Path(__file__).resolve().parent.parent / "data" / "hf" / "deepseek_v3_mla.json"
GPUS = ["--gpus", "4", "--global-batch", "8", "--seq-len", "32", "--json"]


def _torch_parameters() -> dict[str, tuple[int, ...]]:
    cfg = json.loads(CONFIG.read_text())
    config = transformers.AutoConfig.for_model(cfg["model_type"], **{k: v for k, v in cfg.items() if k != "model_type"})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return {n: tuple(p.shape) for n, p in model.named_parameters()}


def _shard(name: str, tp: int, ep: int) -> int:
    """How many ways Megatron-LM splits a parameter: TP over the heads (q_b, kv_b, o), the MLPs'
    hidden units (dense, shared and routed experts: expert TP is TP) and the vocabulary; EP over the
    routed experts; parplan's rule also splits the router's logits over EP (the preset's too)."""
    if ".experts." in name and "shared" not in name:
        return tp * ep
    if name.endswith("mlp.gate.weight"):
        return ep
    heads = any(f"self_attn.{m}." in name for m in ("q_b_proj", "kv_b_proj", "o_proj"))
    mlp = ".mlp." in name and "norm" not in name
    vocab = "embed_tokens" in name or "lm_head" in name
    return tp if heads or mlp or vocab else 1


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert main(args) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def test_traced_deepseek_v3_plans_and_splits_as_megatron(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    graph_file = tmp_path / "dsv3.json"
    assert main(["graph", str(CONFIG), "--seq-len", "32", "--out", str(graph_file)]) == 0
    capsys.readouterr()
    params = _torch_parameters()
    graph = graph_from_json(graph_file.read_text())
    assert sum(n.numel for n in graph.nodes if n.kind is OpKind.PARAMETER) == sum(map(math.prod, params.values()))
    attention = [n for n in graph.nodes if n.kind is OpKind.ATTENTION]
    assert len(attention) == 4
    for n in attention:
        q, k, v = (dict(graph.node(i).dims) for i in n.inputs[:3])
        assert q["head_dim"] == k["head_dim"] == 48 and v["v_head_dim"] == 32 and dict(n.dims)["v_head_dim"] == 32
    keys = graph.node(attention[-1].inputs[1])
    assert keys.kind is OpKind.CONCAT  # k_nope and the rotary key, not a constant buffer

    doc = _run(["plan", "--model", str(graph_file), "--search", "dp", *GPUS], capsys)
    assert doc["model"]["parameters"] == sum(map(math.prod, params.values()))
    assert doc["memory"]["fits"] and doc["time"]["step_seconds"] > 0
    st = doc["strategy"]
    for r in [st] if st["kind"] == "uniform" else st["layers"]:
        assert 8 % r["tp"] == 0 and 128 % r["tp"] == 0 and 8 % r["expert_parallel"] == 0

    for tp, ep in ((1, 1), (2, 1), (2, 2), (1, 4)):
        mem = _run(["memory", "--model", str(graph_file), "--tp", str(tp), "--expert-parallel", str(ep), *GPUS], capsys)
        local = sum(math.prod(shape) // _shard(name, tp, ep) for name, shape in params.items())
        assert mem["memory"]["breakdown"]["parameters"] == 2 * local, (tp, ep)  # bf16


def test_tp_must_divide_every_size_of_a_split_dim() -> None:
    """Megatron-LM splits the dense MLP and the experts over the TP ranks (expert TP is TP): a TP
    degree that divides the dense ``ffn`` (128) but not the experts' (36) is refused, whichever the
    graph meets first."""
    cfg = get_preset("deepseek-v3").with_(name="t", layers=3, hidden=64, heads=8, head_dim=16, ffn=36, vocab=256,
                                          num_experts=4, top_k=2, dense_layers=1, dense_ffn=128, q_lora_rank=32,
                                          kv_lora_rank=32, qk_rope_dim=8, v_head_dim=16, seq_len=64)
    splits = SplitDims.of(build_graph(cfg, batch=2, seq_len=16))
    assert splits.problem(tp=8) == "tp=8 does not divide ffn (36)"
    assert splits.allows(tp=4) and splits.allows(tp=2, ep=4) and not splits.allows(ep=8)


def test_grouped_key_value_heads_are_refused_as_the_models_own_failure(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """transformers' DeepSeek-V3 builds keys and values for every head, then repeats them
    num_attention_heads / num_key_value_heads times: 4 key/value heads of 8 make 16 heads against 8
    queries, which its own forward cannot run. The error says the model fails, in one line."""
    cfg = json.loads(CONFIG.read_text()) | {"num_key_value_heads": 4, "num_hidden_layers": 1}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert main(["graph", str(path), "--seq-len", "16", "--out", str(tmp_path / "g.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert "DeepseekV3ForCausalLM cannot run its own forward" in err and "\n" not in err

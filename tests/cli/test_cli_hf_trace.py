"""Issue 13: a ``config.json`` whose ``model_type`` parplan does not map by hand is built by
transformers on the meta device, traced, and planned by both searches; ``parplan graph`` writes the
graph JSON of a config, a preset or a ``module:factory``; failures are one line (exit status 2)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from parplan.cli import main  # noqa: E402
from parplan.solver.cost.memory import CATEGORIES  # noqa: E402
from parplan.solver.errors import ConfigError  # noqa: E402
from parplan.solver.frontends.hf import has_mapper  # noqa: E402
from parplan.solver.request import RequestError, parse_plan_request  # noqa: E402
from parplan.solver.wire import SCHEMA_PATH  # noqa: E402

DATA = Path(__file__).resolve().parent.parent / "data" / "hf"
#: Tiny configs (2 layers, hidden 64) of architectures without a hand-written mapper; DeepSeek-V3's
#: first layer is dense, its second routes 2 of 4 experts in 2 groups (multi-head latent attention).
TRACED = ["gemma2", "gemma3_text", "phi3", "gpt_neox", "olmo2", "qwen2_moe", "deepseek_v3"]
PLAN = ["--gpus", "2", "--global-batch", "4", "--seq-len", "32", "--json"]


def _config(model_type: str) -> dict[str, Any]:
    cfg: dict[str, Any] = json.loads((DATA / f"{model_type}.json").read_text())
    return cfg


def _torch_parameters(cfg: dict[str, Any]) -> int:
    """The oracle: the parameters of the model transformers builds (meta device, tied once)."""
    config = transformers.AutoConfig.for_model(cfg["model_type"], **{k: v for k, v in cfg.items() if k != "model_type"})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("model_type", TRACED)
def test_fixtures_have_no_hand_written_mapper(model_type: str) -> None:
    assert not has_mapper(_config(model_type))


@pytest.mark.parametrize("search", ["dp", "ilp"])
@pytest.mark.parametrize("model_type", TRACED)
def test_traced_config_plans_with_both_searches(model_type: str, search: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", str(DATA / f"{model_type}.json"), "--search", search, *PLAN]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["model"]["parameters"] == _torch_parameters(_config(model_type))
    assert doc["model"]["seq_len"] == 32
    mem = doc["memory"]
    assert mem["fits"] and mem["peak_bytes"] > 0
    assert set(mem["breakdown"]) >= set(CATEGORIES)
    assert mem["breakdown"]["parameters"] > 0 and mem["breakdown"]["activations"] > 0
    assert doc["time"]["step_seconds"] > 0 and doc["time"]["tokens_per_second"] > 0
    assert doc["strategy"]["summary"]
    assert set(doc["solver"]) >= {"method", "status", "seconds", "gap"}
    for name, base in doc["baselines"].items():
        assert base is None or (base["memory"]["peak_bytes"] > 0 and base["time"]["step_seconds"] > 0), name


def test_memory_of_a_traced_config_with_tp_and_pp(capsys: pytest.CaptureFixture[str]) -> None:
    """``parplan memory`` prices a strategy on the traced graph: TP 2 halves the block weights."""
    common = ["memory", "--model", str(DATA / "phi3.json"), "--gpus", "4", "--seq-len", "32", "--json"]
    docs = []
    for tp in ("1", "2"):
        assert main([*common, "--tp", tp, "--pp", "2", "--global-batch", "8"]) == 0
        docs.append(json.loads(capsys.readouterr().out))
    assert all(d["memory"]["peak_bytes"] > 0 and d["time"]["step_seconds"] > 0 for d in docs)
    assert len(docs[1]["memory"]["stages"]) == 2
    assert docs[1]["memory"]["breakdown"]["parameters"] < docs[0]["memory"]["breakdown"]["parameters"]


def test_moe_trace_has_dispatch_combine_and_k_times_the_expert_flops(tmp_path: Path) -> None:
    """Qwen2-MoE: one dispatch and one combine per layer; the experts see tokens·top_k/experts
    tokens each (capacity), so their einsum is top_k times a dense MLP of the expert width."""
    cfg = _config("qwen2_moe")
    out = tmp_path / "g.json"
    assert main(["graph", str(DATA / "qwen2_moe.json"), "--seq-len", "32", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    kinds = [n["kind"] for n in doc["nodes"]]
    layers = cfg["num_hidden_layers"]
    assert kinds.count("dispatch") == layers and kinds.count("combine") == layers
    dispatch = next(n for n in doc["nodes"] if n["kind"] == "dispatch")
    tokens, k, experts = 2 * 32, cfg["num_experts_per_tok"], cfg["num_experts"]
    assert dispatch["dims"] == {"expert": experts, "capacity": tokens * k // experts, "hidden": cfg["hidden_size"]}
    assert dispatch["attrs"]["top_k"] == k


def test_graph_command_writes_a_schema_valid_graph_that_plans(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    out = tmp_path / "gemma2.graph.json"
    assert main(["graph", str(DATA / "gemma2.json"), "--seq-len", "32", "--out", str(out)]) == 0
    assert "parameters" in capsys.readouterr().err
    doc = json.loads(out.read_text())
    jsonschema.validate(doc, json.loads(SCHEMA_PATH.read_text()))
    assert doc["meta"]["seq_len"] == 32 and doc["meta"]["batch"] == 2
    assert main(["plan", "--model", str(out), "--search", "dp", *PLAN]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["model"]["parameters"] == _torch_parameters(_config("gemma2"))
    assert plan["memory"]["fits"]
    # the same graph is what a client sends as model.graph
    req = parse_plan_request({"model": {"graph": doc}, "cluster": {"gpus": 2}, "training": {"global_batch": 4}})
    assert req.model.graph is not None and req.model.graph.parameter_count() == plan["model"]["parameters"]


def test_graph_command_preset_and_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["graph", "gpt-1.7b", "--seq-len", "64"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["format"] == "parplan.graph/v1" and doc["meta"]["seq_len"] == 64


def test_trace_of_a_hand_mapped_config_matches_the_builder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--trace`` on Mixtral (hand-mapped): the traced graph has the builder's parameter count."""
    cfg = {"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2,
           "vocab_size": 256, "max_position_embeddings": 64, "tie_word_embeddings": False}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert main(["graph", str(path), "--seq-len", "32", "--out", str(tmp_path / "built.json")]) == 0
    assert main(["graph", str(path), "--trace", "--seq-len", "32", "--out", str(tmp_path / "traced.json")]) == 0
    capsys.readouterr()
    built, traced = (json.loads((tmp_path / f).read_text()) for f in ("built.json", "traced.json"))
    assert traced["meta"]["source"] == "torch.export" and "source" not in built["meta"]
    assert traced["meta"]["parameter_count"] == _torch_parameters(cfg)
    numel = [sum(_numel(n) for n in d["nodes"] if n["kind"] == "parameter") for d in (built, traced)]
    assert numel[0] == numel[1] == _torch_parameters(cfg)


def _numel(node: dict[str, Any]) -> int:
    out = 1
    for size in node["dims"].values():
        out *= size
    return out


FACTORY = '''
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(32)
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 32)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 32)
        self.layers = nn.ModuleList([Block() for _ in range(3)])
        self.head = nn.Linear(32, 100)

    def forward(self, ids):
        x = self.emb(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


class Cumulative(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 32)

    def forward(self, ids):
        return torch.cumsum(self.emb(ids), dim=1)


def make():
    return Tiny()


def make_cumulative():
    return Cumulative()
'''


def test_graph_of_a_module_factory_plans(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "tiny_factory.py"
    src.write_text(FACTORY)
    out = tmp_path / "tiny.json"
    assert main(["graph", f"{src}:make", "--batch", "4", "--seq-len", "16", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["meta"]["units"] == ["embed", "layers.0", "layers.1", "layers.2", "head"]
    expected = 100 * 32 + 3 * (2 * 32 + 32 * 64 + 64 + 64 * 32 + 32) + 32 * 100 + 100
    assert doc["meta"]["parameter_count"] == expected
    capsys.readouterr()
    assert main(["plan", "--model", str(out), "--search", "dp", "--gpus", "2", "--global-batch", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"]["parameters"] == expected


def _one_line_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


def test_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    unknown = tmp_path / "config.json"
    unknown.write_text(json.dumps({"model_type": "not_a_model_type", "hidden_size": 64}))
    err = _one_line_error(["plan", "--model", str(unknown), *PLAN], capsys)
    assert "not_a_model_type" in err and "transformers" in err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**_config("gpt_neox"), "vocab_size": "many"}))
    assert "gpt_neox" in _one_line_error(["plan", "--model", str(bad), *PLAN], capsys)
    src = tmp_path / "cum_factory.py"
    src.write_text(FACTORY)
    err = _one_line_error(["graph", f"{src}:make_cumulative"], capsys)
    assert "cumsum" in err
    assert "no callable" in _one_line_error(["graph", f"{src}:missing"], capsys)
    assert "cannot import" in _one_line_error(["graph", "no_such_module_xyz:make"], capsys)


def test_missing_extra_names_it(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)
    err = _one_line_error(["plan", "--model", str(DATA / "phi3.json"), *PLAN], capsys)
    assert "parplan[hf]" in err


def test_service_request_with_an_unmapped_config_says_how_to_send_it() -> None:
    """The service never traces in a request: the problem names ``parplan graph`` and model.graph."""
    body = {"model": {"hf_config": _config("olmo2")}, "cluster": {"gpus": 2}, "training": {"global_batch": 4}}
    with pytest.raises(RequestError) as e:
        parse_plan_request(body)
    assert e.value.args and "parplan graph" in str(e.value) and "model.graph" in str(e.value)


def test_architectures_do_not_map_a_moe_to_its_dense_family() -> None:
    """``Qwen2MoeForCausalLM`` starts like ``Qwen2``: with a model_type the hint is not used."""
    assert not has_mapper({"model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"]})
    assert has_mapper({"architectures": ["Qwen2ForCausalLM"]})
    with pytest.raises(ConfigError, match="qwen2_moe"):
        from parplan.solver.frontends.hf import config_from_hf

        config_from_hf({"model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"]})


@pytest.mark.parametrize("graph_name", ["named", ""])
def test_cli_plans_with_the_model_its_request_reads_back(tmp_path: Path, graph_name: str) -> None:
    """``parplan plan`` hands the planner the graph it resolved instead of the request's JSON copy:
    that model must be the one ``parse_plan_request`` reads from the body (name and every node)."""
    from parplan.cli import build_parser
    from parplan.cli_args import plan_request_and_model
    from parplan.solver.request import model_from_spec
    from parplan.solver.wire import graph_to_dict

    traced = tmp_path / "gemma2.json"
    traced.write_text((DATA / "gemma2.json").read_text())
    graph_file = tmp_path / "model.graph.json"
    args = build_parser().parse_args(["plan", "--model", str(traced), *PLAN])
    body, model = plan_request_and_model(args)
    assert model is not None and model.graph is not None
    doc = graph_to_dict(model.graph) | {"name": graph_name}
    graph_file.write_text(json.dumps(doc))
    for path in (traced, graph_file):
        body, model = plan_request_and_model(build_parser().parse_args(["plan", "--model", str(path), *PLAN]))
        read_back = model_from_spec(body.to_body()["model"])
        assert model is not None and model.graph is not None and read_back.graph is not None
        assert model.name == read_back.name and model.graph == read_back.graph
        assert model.default_seq_len == read_back.default_seq_len
    assert read_back.name == (graph_name or "graph")
    _, preset = plan_request_and_model(build_parser().parse_args(["plan", "--model", "gpt-1.7b", *PLAN]))
    assert preset is None

"""Graph validation: every class of error names the offending node and field."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from parplan.solver.errors import GraphValidationError
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.presets import get_preset
from parplan.solver.validate import validate_graph
from parplan.solver.wire import graph_from_json, graph_to_dict


def _mlp_doc() -> dict[str, Any]:
    """A small valid graph in the wire format (a two-matmul MLP block), a fresh copy per call."""
    doc: dict[str, Any] = json.loads((Path(__file__).parent.parent / "data" / "mlp_graph.json").read_text())
    return doc


def _issues(doc: dict[str, Any]) -> list[tuple[str | None, str, str]]:
    with pytest.raises(GraphValidationError) as info:
        validate_graph(graph_from_json(doc))
    return [(i.node, i.field, i.message) for i in info.value.issues]


def test_valid_graph_passes() -> None:
    validate_graph(graph_from_json(_mlp_doc()))


def test_cycle_is_reported_with_its_path() -> None:
    doc = _mlp_doc()
    doc["nodes"][2]["inputs"] = ["y", "w1"]  # h reads y, y depends on h
    doc["nodes"][2]["dims"] = {"batch": 4, "ffn": 32}
    found = _issues(doc)
    assert any(f == "inputs" and "cycle" in m and "h" in m and "y" in m for _, f, m in found)


def test_self_loop_is_a_cycle() -> None:
    doc = _mlp_doc()
    doc["nodes"][3]["inputs"] = ["a"]
    assert ("a", "inputs[0]", "node reads its own output (cycle)") in _issues(doc)


def test_dangling_input_names_node_and_position() -> None:
    doc = _mlp_doc()
    doc["nodes"][5]["inputs"] = ["a", "w9"]
    found = _issues(doc)
    assert found[0][:2] == ("y", "inputs[1]")
    assert "'w9'" in found[0][2]


def test_dim_size_mismatch_between_producer_and_consumer() -> None:
    doc = _mlp_doc()
    doc["nodes"][4]["dims"] = {"ffn": 16, "hidden": 8}  # w2 disagrees with a's ffn = 32
    found = _issues(doc)
    node, field, msg = found[0]
    assert (node, field) == ("y", "inputs[1]")
    assert "'ffn'" in msg and "16" in msg and "32" in msg


def test_declared_output_dims_must_follow_from_inputs() -> None:
    doc = _mlp_doc()
    doc["nodes"][3]["dims"] = {"batch": 4, "ffn": 33}
    assert any(n == "a" and f == "dims.ffn" for n, f, _ in _issues(doc))


def test_unknown_op_kind() -> None:
    doc = _mlp_doc()
    doc["nodes"][3]["kind"] = "frobnicate"
    found = _issues(doc)
    assert found[0][:2] == ("a", "kind")
    assert "frobnicate" in found[0][2]


@pytest.mark.parametrize("size", [0, -3])
def test_non_positive_size(size: int) -> None:
    doc = _mlp_doc()
    doc["nodes"][1]["dims"] = {"hidden": 8, "ffn": size}
    assert any(n == "w1" and f == "dims.ffn" and "positive" in m for n, f, m in _issues(doc))


def test_absurd_size() -> None:
    doc = _mlp_doc()
    doc["nodes"][0]["dims"] = {"batch": 2**40, "hidden": 8}
    assert any(n == "x" and f == "dims.batch" and "absurd" in m for n, f, m in _issues(doc))


def test_absurd_tensor_numel() -> None:
    doc = _mlp_doc()
    doc["nodes"][0]["dims"] = {"batch": 2**30, "hidden": 2**30}
    assert any(n == "x" and f == "dims" and "absurd" in m for n, f, m in _issues(doc))


def test_duplicated_id() -> None:
    doc = _mlp_doc()
    doc["nodes"].append(copy.deepcopy(doc["nodes"][3]))
    assert ("a", "id", "duplicated id") in _issues(doc)


def test_wrong_json_types_name_the_node_and_path() -> None:
    doc = _mlp_doc()
    doc["nodes"][2]["dims"] = {"batch": "four", "ffn": 32}
    found = _issues(doc)
    assert found[0][0] == "h"
    assert found[0][1].startswith("nodes.2.dims.batch")


def test_einsum_equation_must_match_operands() -> None:
    doc = _mlp_doc()
    doc["nodes"][2]["attrs"]["equation"] = "batch model, hidden ffn -> batch ffn"
    assert any(n == "h" and f == "inputs[0]" for n, f, _ in _issues(doc))


def test_einsum_needs_equation() -> None:
    doc = _mlp_doc()
    del doc["nodes"][2]["attrs"]
    assert any(n == "h" and f == "attrs.equation" for n, f, _ in _issues(doc))


def test_arity_is_checked() -> None:
    doc = _mlp_doc()
    doc["nodes"][1]["inputs"] = ["x"]
    assert any(n == "w1" and f == "inputs" and "takes 0" in m for n, f, m in _issues(doc))


def test_unknown_elementwise_fn_and_dtype() -> None:
    doc = _mlp_doc()
    doc["nodes"][3]["attrs"]["fn"] = "mystery"
    doc["nodes"][3]["dtype"] = "bf17"
    fields = {(n, f) for n, f, _ in _issues(doc)}
    assert {("a", "attrs.fn"), ("a", "dtype")} <= fields


def test_every_issue_is_reported_not_just_the_first() -> None:
    doc = _mlp_doc()
    doc["nodes"][4]["dims"] = {"ffn": 16, "hidden": 8}  # size mismatch at y
    doc["nodes"][0]["dims"] = {"batch": 0, "hidden": 8}  # non-positive size at x
    doc["nodes"].append({"id": "z", "kind": "dropout", "inputs": ["ghost"], "dims": {"a": 1}})
    nodes = {n for n, _, _ in _issues(doc)}
    assert {"x", "z"} <= nodes


@pytest.mark.parametrize("name", ["gpt-1.7b", "llama-2-7b", "bert-large", "t5-11b", "vit-huge", "mixtral-8x7b"])
def test_every_family_builds_a_valid_graph_that_round_trips(name: str) -> None:
    cfg = get_preset(name)
    g = build_graph(cfg.with_(layers=2, decoder_layers=2 if cfg.family == "t5" else 0), batch=2,
                    seq_len=min(cfg.seq_len, 128) if cfg.family != "vit" else None)
    validate_graph(g)
    again = graph_from_json(graph_to_dict(g))
    validate_graph(again)
    assert graph_to_dict(again) == graph_to_dict(g)
    assert again.parameter_count() == g.parameter_count()


def test_large_graph_validates() -> None:
    """A 100k-node chain validates (its speed is measured in bench/load_presets.py)."""
    nodes: list[dict[str, Any]] = [{"id": "n0", "kind": "input", "dims": {"batch": 8, "hidden": 64}}]
    nodes += [{"id": f"n{i}", "kind": "elementwise", "inputs": [f"n{i - 1}"], "dims": {"batch": 8, "hidden": 64},
               "attrs": {"fn": "relu"}} for i in range(1, 100_000)]
    validate_graph(graph_from_json({"nodes": nodes}))


def _reshaped_doc() -> dict[str, Any]:
    """The MLP with its output flattened to ``[tokens]`` of a fixed size: resizing ``batch`` breaks
    the reshape's element count."""
    doc = _mlp_doc()
    last = doc["nodes"][-1]
    numel = 1
    for size in last["dims"].values():
        numel *= size
    doc["nodes"].append({"id": "flat", "kind": "reshape", "inputs": [last["id"]], "dims": {"tokens": numel},
                         "dtype": last.get("dtype", "bf16")})
    return doc


@pytest.mark.parametrize("sizes", [{"batch": 3}, {"batch": 2**37}, {"batch": 2**30, "hidden": 2**30},
                                   {"hidden": 0}])
@pytest.mark.parametrize("doc", [_mlp_doc, _reshaped_doc])
def test_resized_graph_is_checked_as_a_fresh_copy_would_be(doc: Any, sizes: dict[str, int]) -> None:
    """``validate_graph(g, resized_from=valid)`` skips the structure checks a resize cannot break:
    it must report exactly what a full validation of a fresh copy of the graph reports."""
    from parplan.solver.ir import Graph, Node

    graph = graph_from_json(doc())
    validate_graph(graph)
    resized = Graph.of(graph.name, [n if n.is_parameter else Node(n.id, n.kind, n.inputs, tuple(
        (d, sizes.get(d, s)) for d, s in n.dims), n.dtype, n.layer, n.attrs) for n in graph.nodes], graph.meta)
    fresh = graph_from_json(graph_to_dict(resized))

    def issues(g: Any, **kw: Any) -> list[tuple[str | None, str, str]] | None:
        try:
            validate_graph(g, **kw)
        except GraphValidationError as e:
            return [(i.node, i.field, i.message) for i in e.issues]
        return None

    expected = issues(fresh)
    assert issues(resized, resized_from=graph) == expected
    assert (expected is None) == (sizes == {"batch": 3} and doc is _mlp_doc)


def test_a_graph_that_passed_is_not_checked_again() -> None:
    graph = graph_from_json(_mlp_doc())
    validate_graph(graph)
    assert graph.memo.get("validated") is True
    validate_graph(graph)  # and a graph that failed is never marked
    doc = _mlp_doc()
    doc["nodes"][2]["inputs"] = ["x", "nowhere"]
    bad = graph_from_json(doc)
    for _ in range(2):
        with pytest.raises(GraphValidationError):
            validate_graph(bad)
    assert "validated" not in bad.memo

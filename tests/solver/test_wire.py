"""JSON wire format, its generated JSON Schema, and networkx conversion."""

from __future__ import annotations

import json

import networkx as nx

from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.presets import get_preset
from parplan.solver.validate import validate_graph
from parplan.solver.wire import SCHEMA_PATH, from_networkx, graph_to_dict, json_schema, to_networkx


def test_schema_file_is_generated_from_the_code() -> None:
    """`python -m parplan.solver.wire` regenerates it; a stale file fails here."""
    assert json.loads(SCHEMA_PATH.read_text()) == json.loads(json.dumps(json_schema(), sort_keys=True))


def test_schema_describes_the_node_fields() -> None:
    schema = json_schema()
    node = schema["$defs"]["NodeDoc"]
    assert set(node["required"]) == {"id", "kind", "dims"}
    assert {"inputs", "dtype", "layer", "attrs"} <= set(node["properties"])


def test_networkx_round_trip_keeps_argument_order_and_repeated_inputs() -> None:
    g = build_graph(get_preset("llama-2-7b").with_(layers=2), batch=1, seq_len=64)
    nxg = to_networkx(g)
    assert isinstance(nxg, nx.DiGraph) and nx.is_directed_acyclic_graph(nxg)
    assert nxg.number_of_nodes() == len(g)
    back = from_networkx(nxg)
    validate_graph(back)
    assert graph_to_dict(back) == graph_to_dict(g)


def test_networkx_edge_positions_for_an_op_reading_one_tensor_twice() -> None:
    from parplan.solver.ir import Graph, make_node

    g = Graph.of("sq", [make_node("x", "input", (), {"n": 4}, dtype="bf16"),
                        make_node("y", "elementwise", ["x", "x"], {"n": 4}, fn="mul")])
    nxg = to_networkx(g)
    assert nxg.edges["x", "y"]["positions"] == [0, 1]
    assert from_networkx(nxg).node("y").inputs == ("x", "x")

"""JSON wire format of the graph IR, its JSON Schema, and conversion to/from networkx.

Wire format (``parplan.graph/v1``)::

    {"format": "parplan.graph/v1", "name": "gpt-1.7b", "meta": {...},
     "nodes": [{"id": "x", "kind": "input", "dims": {"batch": 8, "seq": 2048}, "dtype": "int64"},
               {"id": "w", "kind": "parameter", "dims": {"vocab": 51200, "hidden": 2304}},
               {"id": "emb", "kind": "embedding", "inputs": ["x", "w"],
                "dims": {"batch": 8, "seq": 2048, "hidden": 2304}, "layer": null,
                "attrs": {"index_dim": "vocab"}}]}

``python -m parplan.solver.wire`` writes the schema to ``parplan/schemas/graph.schema.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from parplan.solver.errors import GraphIssue, GraphValidationError
from parplan.solver.ir import Graph, Node, OpKind, make_node

if TYPE_CHECKING:  # networkx takes a quarter of a second to import: only the converters import it
    import networkx as nx

FORMAT = "parplan.graph/v1"
SCHEMA_PATH = Path(__file__).resolve().parent.parent / "schemas" / "graph.schema.json"


class NodeDoc(BaseModel):
    """One operator and the tensor it produces."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, max_length=256, description="Unique node id.")
    kind: str = Field(description="Operator kind: " + ", ".join(k.value for k in OpKind) + ".")
    inputs: list[str] = Field(default_factory=list, description="Ids of the producer nodes, in argument order.")
    dims: dict[str, int] = Field(description="Ordered named dims of the output tensor: name -> size (elements).")
    dtype: str = Field(default="bf16", description="Element type of the output tensor.")
    layer: str | None = Field(default=None, description="Tag shared by the nodes of one repeated block.")
    attrs: dict[str, Any] = Field(default_factory=dict, description="Kind-specific attributes.")


class GraphDoc(BaseModel):
    """A model as an operator graph over tensors with named dims."""

    model_config = ConfigDict(extra="forbid", title="parplan graph")

    format: str = Field(default=FORMAT, pattern=r"^parplan\.graph/v1$")
    name: str = Field(default="graph", max_length=256)
    meta: dict[str, Any] = Field(default_factory=dict)
    nodes: list[NodeDoc] = Field(min_length=1)


def graph_from_doc(doc: GraphDoc) -> Graph:
    """Build a :class:`Graph` from a parsed document; unknown kinds raise with the node id."""
    issues: list[GraphIssue] = []
    nodes: list[Node] = []
    kinds = {k.value for k in OpKind}
    for nd in doc.nodes:
        if nd.kind not in kinds:
            issues.append(GraphIssue(nd.id, "kind", f"unknown op kind {nd.kind!r}; known: {', '.join(sorted(kinds))}"))
            continue
        nodes.append(make_node(nd.id, nd.kind, nd.inputs, nd.dims, dtype=nd.dtype, layer=nd.layer, **nd.attrs))
    if issues:
        raise GraphValidationError(issues)
    return Graph.of(doc.name, nodes, doc.meta)


def graph_from_json(data: str | bytes | dict[str, Any]) -> Graph:
    """Parse the wire format (text or an already-decoded dict). Type errors name the JSON path."""
    try:
        doc = GraphDoc.model_validate_json(data) if isinstance(data, str | bytes) else GraphDoc.model_validate(data)
    except ValidationError as e:
        issues = []
        for err in e.errors()[:50]:
            loc = list(err["loc"])
            node_id = None
            if len(loc) >= 2 and loc[0] == "nodes" and isinstance(loc[1], int):
                raw = data if isinstance(data, dict) else None
                node_id = _node_id_at(raw, loc[1])
            issues.append(GraphIssue(node_id, ".".join(str(p) for p in loc), err["msg"]))
        raise GraphValidationError(issues) from None
    return graph_from_doc(doc)


def _node_id_at(raw: dict[str, Any] | None, index: int) -> str:
    try:
        nid = raw["nodes"][index]["id"] if raw is not None else None
    except (KeyError, IndexError, TypeError):
        nid = None
    return str(nid) if isinstance(nid, str) else f"#{index}"


def graph_to_dict(graph: Graph) -> dict[str, Any]:
    """The wire document of a graph, as plain JSON-able Python."""
    nodes = []
    for n in graph.nodes:
        d: dict[str, Any] = {"id": n.id, "kind": n.kind.value, "dims": dict(n.dims)}
        if n.inputs:
            d["inputs"] = list(n.inputs)
        if n.dtype != "bf16":
            d["dtype"] = n.dtype
        if n.layer is not None:
            d["layer"] = n.layer
        if n.attrs:
            d["attrs"] = dict(n.attrs)
        nodes.append(d)
    return {"format": FORMAT, "name": graph.name, "meta": dict(graph.meta), "nodes": nodes}


def graph_to_json(graph: Graph, indent: int | None = None) -> str:
    return json.dumps(graph_to_dict(graph), indent=indent)


def to_networkx(graph: Graph) -> nx.DiGraph:
    """A DiGraph with one vertex per node (attributes kind, dims, dtype, layer, attrs) and an
    edge producer -> consumer whose ``positions`` lists the argument slots it feeds."""
    import networkx as nx

    g = nx.DiGraph(name=graph.name, meta=dict(graph.meta))
    for n in graph.nodes:
        g.add_node(n.id, kind=n.kind.value, dims=dict(n.dims), dtype=n.dtype, layer=n.layer,
                   attrs=dict(n.attrs))
    for n in graph.nodes:
        for pos, i in enumerate(n.inputs):
            if g.has_edge(i, n.id):
                g.edges[i, n.id]["positions"].append(pos)
            else:
                g.add_edge(i, n.id, positions=[pos])
    return g


def from_networkx(g: nx.DiGraph) -> Graph:
    """Inverse of :func:`to_networkx` (node order: the DiGraph's insertion order)."""
    nodes = []
    for nid, data in g.nodes(data=True):
        slots: dict[int, str] = {}
        for pred in g.predecessors(nid):
            for pos in g.edges[pred, nid]["positions"]:
                slots[pos] = pred
        inputs = [slots[p] for p in sorted(slots)]
        nodes.append(make_node(nid, data["kind"], inputs, data["dims"], dtype=data.get("dtype", "bf16"),
                               layer=data.get("layer"), **data.get("attrs", {})))
    return Graph.of(g.graph.get("name", "graph"), nodes, g.graph.get("meta"))


def json_schema() -> dict[str, Any]:
    """The JSON Schema of the wire format, generated from :class:`GraphDoc`."""
    schema = GraphDoc.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://parplan.dev/schemas/graph.schema.json"
    return schema


def write_schema(path: Path = SCHEMA_PATH) -> None:
    path.write_text(json.dumps(json_schema(), indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":  # pragma: no cover
    write_schema(Path(sys.argv[1]) if len(sys.argv) > 1 else SCHEMA_PATH)

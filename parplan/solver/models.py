"""Resolve what a user names as a model: a preset, a graph JSON file, or an HF ``config.json``."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from parplan.solver.errors import ConfigError, UnknownModelError
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.frontends.hf import config_from_hf, has_mapper, supported_model_types
from parplan.solver.frontends.presets import get_preset
from parplan.solver.frontends.resize import resize_graph
from parplan.solver.ir import Graph
from parplan.solver.validate import validate_graph


@dataclass(frozen=True)
class ModelSource:
    """A model known either by its architecture (rebuildable at any batch / sequence length) or
    as a fixed operator graph (resizable along its ``batch`` and ``seq`` dims)."""

    name: str
    config: TransformerConfig | None = None
    graph: Graph | None = None

    def architecture(self) -> dict[str, Any] | None:
        """The sizes a trainer's export writes the model from (a document's ``model.architecture``);
        None for an operator graph, which has none."""
        return asdict(self.config) if self.config is not None else None

    def build(self, micro_batch: int, seq_len: int | None = None) -> Graph:
        """The graph of one micro-batch of ``micro_batch`` samples of ``seq_len`` tokens."""
        if self.config is not None:
            return build_graph(self.config, batch=micro_batch, seq_len=seq_len)
        assert self.graph is not None
        sizes = {"batch": micro_batch} | ({"seq": seq_len} if seq_len else {})
        return resize_graph(self.graph, sizes)

    @property
    def default_seq_len(self) -> int:
        if self.config is not None:
            return self.config.tokens_per_sample
        assert self.graph is not None
        seq = self.graph.meta.get("seq_len") or _dim_size(self.graph, "seq")
        return int(seq or 1)

    def parameter_count(self) -> int:
        if self.graph is not None:
            return self.graph.parameter_count()
        assert self.config is not None
        return build_graph(self.config, batch=1, seq_len=min(self.config.seq_len, 8)
                           if self.config.family != "vit" else None).parameter_count()


def _dim_size(graph: Graph, dim: str) -> int | None:
    for n in graph.nodes:
        size = dict(n.dims).get(dim)
        if size is not None:
            return size
    return None


def model_from_json(doc: dict[str, Any], name: str, *, trace: bool = False, seq_len: int | None = None,
                    trace_mapped: bool = False) -> ModelSource:
    """A graph document (``format: parplan.graph/v1``) or an HF config (``model_type``).

    An HF config without a hand-written mapper (or any HF config, when ``trace_mapped``) is built by
    transformers and traced when ``trace`` (at ``seq_len`` tokens, default its maximum positions);
    otherwise it is a ConfigError that says how to trace it (the service never traces in a request)."""
    # the graph reader (pydantic) and the tracer (torch, transformers) are imported when needed:
    # planning a preset pays for neither
    if "nodes" in doc or str(doc.get("format", "")).startswith("parplan.graph"):
        from parplan.solver.wire import graph_from_json

        graph = graph_from_json(doc)
        validate_graph(graph)
        return ModelSource(graph.name or name, graph=graph)
    if (trace_mapped or not has_mapper(doc)) and isinstance(doc.get("model_type"), str):
        from parplan.solver.frontends.hf_trace import HF_EXTRA, trace_hf_config

        if trace:
            graph = trace_hf_config(doc, name, seq_len=seq_len)
            validate_graph(graph)
            return ModelSource(name, graph=graph)
        raise ConfigError(f"HF model_type {doc['model_type']!r} has no hand-written mapper (mapped: "
                          f"{', '.join(supported_model_types())}); trace it into a graph with `parplan graph "
                          f"config.json --out graph.json` (needs {HF_EXTRA}) and send that as model.graph")
    cfg = config_from_hf(doc, name=name)
    return ModelSource(cfg.name, config=cfg)


def resolve_model(spec: str, *, seq_len: int | None = None, trace: bool = False) -> ModelSource:
    """A preset name, or the path of a graph JSON / HF ``config.json`` file. An HF config without a
    hand-written mapper (any HF config, with ``trace``) is traced (see :func:`model_from_json`) at
    ``seq_len`` tokens."""
    path = Path(spec)
    if spec.endswith(".json") or path.is_file():
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            raise UnknownModelError(f"no such file: {spec}") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ConfigError(f"{spec}: not readable JSON ({e})") from None
        if not isinstance(doc, dict):
            raise ConfigError(f"{spec}: expected a JSON object")
        return model_from_json(doc, name=path.parent.name if path.name == "config.json" else path.stem, trace=True,
                               seq_len=seq_len, trace_mapped=trace)
    cfg = get_preset(spec)
    return ModelSource(cfg.name, config=cfg)

"""The tracer package's dispatch table: :data:`OP_TABLE` and the handlers agree, every entry is a
real ATen operator, and tiny configs trace to the graphs recorded for them."""

from __future__ import annotations

import hashlib
import inspect
import json
import types
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from parplan.solver.frontends.hf_trace import trace_hf_config  # noqa: E402
from parplan.solver.frontends.torch_trace import OP_TABLE  # noqa: E402
from parplan.solver.frontends.torch_trace.op import ATEN_OPS, handles  # noqa: E402
from parplan.solver.frontends.torch_trace.table import HANDLER_MODULES, HANDLERS, collect  # noqa: E402
from parplan.solver.wire import graph_to_dict  # noqa: E402

DATA = Path(__file__).resolve().parent.parent / "data" / "hf"


def test_op_table_and_handlers_name_the_same_operators() -> None:
    assert set(OP_TABLE) == set(HANDLERS)
    for op, handler in HANDLERS.items():
        assert getattr(handler, ATEN_OPS)[op] == OP_TABLE[op]
        assert list(inspect.signature(handler).parameters) == ["t", "node", "args", "op"], handler.__name__


def test_every_handler_function_is_dispatched() -> None:
    """A ``map_*`` function in a handler module that declares no operator would be dead code."""
    declared = set(HANDLERS.values())
    for module in HANDLER_MODULES:
        for name, fn in vars(module).items():
            if name.startswith("map_") and inspect.isfunction(fn) and fn.__module__ == module.__name__:
                assert fn in declared, f"{module.__name__}.{name} handles no operator"


def test_every_entry_is_an_aten_operator() -> None:
    """The names are ATen overload packets (a typo would never match a traced op)."""
    missing = [op for op in OP_TABLE if not hasattr(torch.ops.aten, op)]
    assert missing == []


def test_an_operator_declared_twice_is_refused() -> None:
    def first(t: Any, node: Any, args: dict[str, Any], op: str) -> None:
        return None

    def second(t: Any, node: Any, args: dict[str, Any], op: str) -> None:
        return None

    mod = types.ModuleType("twice")
    mod.first = handles("mm", maps_to="einsum")(first)  # type: ignore[attr-defined]
    mod.second = handles("mm", "bmm", maps_to="einsum")(second)  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"aten\.mm is declared by first and second"):
        collect([mod])
    with pytest.raises(ValueError, match=r"declares aten\.bmm twice"):
        handles("bmm", maps_to="einsum")(second)


#: SHA-256 of the sorted graph JSON of tiny configs traced at 2 x 32 tokens (torch 2.13.0,
#: transformers 5.23.0): a change to the tracer that moves a graph fails here. One that is meant to
#: change graphs updates these (print them with :func:`graph_digest`); a transformers upgrade may too.
RECORDED_DIGESTS = {
    "qwen2": "7f841b8528f526d3bc077713d8e0f3d3f6bd035fd573a8693e6fb4d26cce4781",
    "gpt_neox": "d8bf2968a6a1eb06d931086b5875bfed9c36d5b736e0a9240e73e8e1d66c2aa4",
    "gemma2": "0e275d0c103d2b31eab7d89b7ccc696c3eb49822bf988c811ef73b614bf4461b",
    "qwen2_moe": "ffe212c16973e5d17553b587cfd29225d514adbca3223117f4e5e1fb29abf423",
}
#: qwen2.json is Qwen2.5-7B's full config; these make it tiny (3 layers, hidden 64).
TINY_QWEN2 = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 64}


def graph_digest(model_type: str) -> str:
    cfg = json.loads((DATA / f"{model_type}.json").read_text())
    if model_type == "qwen2":
        cfg.update(TINY_QWEN2)
    if transformers_version() != "5.23.0":
        pytest.skip("digests recorded with transformers 5.23.0")
    doc = graph_to_dict(trace_hf_config(cfg, model_type, seq_len=32))
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def transformers_version() -> str:
    import transformers

    return str(transformers.__version__)


@pytest.mark.parametrize("model_type", sorted(RECORDED_DIGESTS))
def test_traced_graphs_match_their_recorded_digests(model_type: str) -> None:
    assert graph_digest(model_type) == RECORDED_DIGESTS[model_type]

"""torch.export plumbing: the module wrapper, its inputs, and walking fx graphs and module stacks."""

from __future__ import annotations

import contextlib
import importlib
import inspect
from collections.abc import Iterator, Mapping
from typing import Any

from parplan.solver.errors import ConfigError
from parplan.solver.frontends.torch_trace.constants import ALIAS


def block_of(path: str) -> str | None:
    """``model.layers.3`` for ``model.layers.3.mlp.fc1``: the path through its first index."""
    parts = path.split(".")
    for i, p in enumerate(parts):
        if p.isdigit():
            return ".".join(parts[: i + 1])
    return None


def flatten(x: Any) -> list[Any]:
    if isinstance(x, list | tuple):
        return [y for item in x for y in flatten(item)]
    return [x]


def is_tensor(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def is_fx_node(x: Any) -> bool:
    return hasattr(x, "op") and hasattr(x, "all_input_nodes")


def strip(path: str) -> str:
    """Drop the wrapper's ``inner`` prefix from a module path or parameter name."""
    if path == "inner":
        return ""
    return path[len("inner."):] if path.startswith("inner.") else path


def stack_paths(node: Any) -> list[str]:
    """Module paths of a node's ``nn_module_stack``, outermost first."""
    return [strip(v[0] if isinstance(v, tuple) else str(v)) for v in (node.meta.get("nn_module_stack") or {}).values()]


def import_torch() -> Any:
    try:
        import torch
    except ImportError as e:  # pragma: no cover - exercised only without torch
        raise ConfigError("tracing PyTorch modules needs torch: install parplan[torch]") from e
    return torch


@contextlib.contextmanager
def no_stack_traces() -> Iterator[None]:
    """Export without recording each fx node's Python stack trace (``torch.fx.config.
    do_not_emit_stack_traces``): the tracer never reads ``meta["stack_trace"]``, and collecting and
    symbolising a traceback per node is about a tenth of exporting a few decoder layers. The flag
    is process-wide, so it is restored afterwards; a torch without it exports as before."""
    config: Any
    try:
        config = importlib.import_module("torch.fx.config")
    except ImportError:  # pragma: no cover - a torch without the module
        config = None
    if config is None or not hasattr(config, "do_not_emit_stack_traces"):
        yield
        return
    before = config.do_not_emit_stack_traces
    config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        config.do_not_emit_stack_traces = before


def split_inputs(torch: Any, module: Any, example_inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(example_inputs, Mapping):
        args: tuple[Any, ...] = ()
        kwargs = dict(example_inputs)
    elif isinstance(example_inputs, torch.Tensor):
        args, kwargs = (example_inputs,), {}
    else:
        args, kwargs = tuple(example_inputs), {}
    meta = any(p.device.type == "meta" for p in module.parameters())

    def move(x: Any) -> Any:
        return x.to("meta") if meta and isinstance(x, torch.Tensor) else x

    return tuple(move(a) for a in args), {k: move(v) for k, v in kwargs.items()}


def export_input_names(module: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[str]:
    """Names of the tensor inputs in export order: forward's parameter names, then keywords."""
    try:
        params = [p.name for p in inspect.signature(module.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):  # pragma: no cover - forward without a signature
        params = []
    names = [params[i] if i < len(params) else f"input{i}" for i, a in enumerate(args) if is_tensor(a)]
    return names + [k for k, v in kwargs.items() if is_tensor(v)]


def wrap(torch: Any, module: Any) -> Any:
    """A module returning the flat tuple of tensors that ``module`` returns (drops KV caches)."""

    def tensors(out: Any) -> list[Any]:
        if isinstance(out, torch.Tensor):
            return [out]
        if isinstance(out, Mapping):
            return [t for v in out.values() for t in tensors(v)]
        if isinstance(out, list | tuple):
            return [t for v in out for t in tensors(v)]
        return []

    class _Wrapped(torch.nn.Module):  # type: ignore[misc]
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
            out = tuple(tensors(self.inner(*args, **kwargs)))
            if not out:
                raise ConfigError(f"{type(self.inner).__name__} returned no tensor")
            return out

    return _Wrapped(module)


def live_nodes(graph: Any) -> set[Any]:
    """Nodes the graph's output depends on."""
    live: set[Any] = set()
    stack = [n for n in graph.nodes if n.op == "output"]
    while stack:
        n = stack.pop()
        if n not in live:
            live.add(n)
            stack.extend(n.all_input_nodes)
    return live


def alias_chain(n: Any, x: Any, inside: set[Any]) -> bool:
    """Whether ``n`` is ``x`` through casts and copies only (all inside the region)."""
    while n is not x:
        packet = getattr(getattr(getattr(n, "target", None), "overloadpacket", None), "__name__", None)
        if n not in inside or packet not in ALIAS or not n.args or not is_fx_node(n.args[0]):
            return False
        n = n.args[0]
    return True

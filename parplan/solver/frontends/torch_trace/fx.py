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


def export_failure(module: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any], error: BaseException) -> str:
    """Why ``torch.export`` failed on ``module``: when the module's own forward fails on the same
    inputs too, the module (its sizes), not the export, is at fault, and the message says so."""
    name = type(module).__name__
    try:
        module(*args, **kwargs)
    except Exception as own:  # the module's own code, any exception type
        return (f"{name} cannot run its own forward on these inputs, without torch.export: {type(own).__name__}: "
                f"{own} (a combination of sizes its code does not support)")
    return f"torch.export could not trace {name}: {type(error).__name__}: {error}"


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


#: Ops that allocate a tensor whose values are all overwritten before it is read when copies tile it.
_FRESH = frozenset({"empty", "new_empty", "empty_like", "zeros", "new_zeros", "zeros_like"})


def _packet(n: Any) -> str | None:
    return getattr(getattr(getattr(n, "target", None), "overloadpacket", None), "__name__", None)


def _slice_range(s: Any, rank: int, sizes: Any) -> tuple[int, int, int] | None:
    """``(dim, start, stop)`` of an ``aten.slice`` of step 1 (bounds clamped), else None."""
    dim, start, end, step = (list(s.args[1:]) + [0, None, None, 1][len(s.args) - 1:])[:4]
    if s.kwargs or step != 1 or not isinstance(dim, int):
        return None
    d = dim % rank
    size = int(sizes[d])

    def clamp(x: Any, default: int) -> int | None:
        if x is None:
            return default
        return min(max(int(x) + size if int(x) < 0 else int(x), 0), size) if isinstance(x, int) else None

    lo, hi = clamp(start, 0), clamp(end, size)
    return None if lo is None or hi is None else (d, lo, hi)


def _tiling(buf: Any) -> tuple[int, list[Any], list[Any]] | None:
    """``(dim, sources by offset, copy nodes)`` when ``buf`` is written by ``copy_`` into slices
    along one dim that tile it (each slice copied once, from a tensor of the slice's shape) and is
    read otherwise only after the last copy; else None."""
    val = buf.meta.get("val")
    if not is_tensor(val) or not val.shape:
        return None
    pieces: list[tuple[int, int, Any, Any]] = []
    dims: set[int] = set()
    for s in [u for u in buf.users if _packet(u) == "slice" and u.args[0] is buf]:
        where = _slice_range(s, len(val.shape), val.shape)
        copies = [u for u in s.users if _packet(u) == "copy_" and u.args[0] is s]
        if where is None or len(s.users) != 1 or len(copies) != 1:
            return None
        src = copies[0].args[1]
        sval = src.meta.get("val") if is_fx_node(src) else None
        if sval is None or not is_tensor(sval) or tuple(sval.shape) != tuple(s.meta["val"].shape):
            return None
        dims.add(where[0])
        pieces.append((where[1], where[2], src, copies[0]))
    if len(dims) != 1 or len(pieces) < 2:
        return None
    pieces.sort(key=lambda p: p[0])
    d = dims.pop()
    bounds = [0, *(b for p in pieces for b in p[:2]), int(val.shape[d])]
    if any(a != b for a, b in zip(bounds[::2], bounds[1::2], strict=True)):  # each piece ends where the next starts
        return None
    return d, [p[2] for p in pieces], [p[3] for p in pieces]


def fill_by_copies(torch: Any, graph: Any) -> None:
    """Rewrite a fresh buffer filled by copies into slices that tile it (DeepSeek-V3's keys:
    ``new_empty`` then ``key[..., :nope].copy_(k_nope)``, ``key[..., nope:].copy_(k_rot)``) as the
    concatenation of the copied tensors, which it is: the export keeps ``copy_`` in place, so the
    buffer would otherwise read as a constant and the copies as dead code."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    for buf in [n for n in graph.nodes if n.op == "call_function" and _packet(n) in _FRESH]:
        found = _tiling(buf)
        if found is None:
            continue
        dim, sources, copies = found
        last = max(copies, key=order.__getitem__)
        readers = [u for u in buf.users if _packet(u) != "slice" or u.args[0] is not buf]
        if any(order[r] < order[last] for r in readers):
            continue
        with graph.inserting_after(last):
            cat = graph.call_function(torch.ops.aten.cat.default, (list(sources), dim))
        cat.meta.update({k: v for k, v in last.meta.items() if k in ("nn_module_stack", "stack_trace")})
        cat.meta["val"] = buf.meta["val"]
        for r in readers:
            r.replace_input_with(buf, cat)

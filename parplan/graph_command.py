"""``parplan graph``: write the graph JSON (``parplan/schemas/graph.schema.json``, what a client
sends as ``model.graph``) of a preset, a Hugging Face ``config.json`` or a Python
``module:factory`` returning an ``nn.Module``; registered by :mod:`parplan.cli`.

Presets and hand-mapped configs are built by parplan's builder; other configs (or any config with
``--trace``) are built by transformers on the meta device and traced; a factory is called under
``torch.device("meta")`` and traced on token ids of ``--batch`` x ``--seq-len``. A traced graph is
resized to one sample after a trace at two (a size-1 axis would vanish from the trace), and the
samples and tokens are traced at two sizes where they are equal (axes are named by their size).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from parplan.cli_args import int_at_least
from parplan.solver.ir import DTYPE_BYTES, Graph

#: a sequence of at least two tokens (a size-1 axis is dropped from a trace)
_AT_LEAST_TWO = int_at_least(2, " (a size-1 dim is dropped)")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    g = sub.add_parser("graph", help="write a model's graph JSON (for model.graph or --model graph.json)",
                       description="Write the operator graph of a preset, an HF config.json (traced with "
                                   "transformers when parplan has no hand-written mapper for its model_type) or a "
                                   "Python module:factory returning an nn.Module (traced on the meta device).")
    g.add_argument("model", help="preset name, HF config.json, or module:factory (also path/to/file.py:factory)")
    g.add_argument("--out", metavar="FILE", default=None, help="write the JSON to FILE (default: standard output)")
    g.add_argument("--batch", type=int_at_least(1), default=2,
                   help="samples the graph is built for (default 2; plans resize it to their micro-batch)")
    g.add_argument("--seq-len", type=_AT_LEAST_TWO, default=None,
                   help="tokens per sample (default: the model's maximum positions; a factory: 128)")
    g.add_argument("--trace", action="store_true",
                   help="trace an HF config with transformers even when parplan maps its model_type by hand")
    g.add_argument("--float-dtype", choices=[d for d in DTYPE_BYTES if d in ("fp32", "bf16", "fp16")],
                   default="bf16", help="dtype of traced floating-point tensors (default bf16, as mixed-precision "
                                        "training computes; a factory's or traced model's own dtype is ignored)")
    g.set_defaults(handler=cmd_graph)


def _is_factory(spec: str) -> bool:
    head, sep, tail = spec.rpartition(":")
    return bool(sep and head and tail.isidentifier()) and not Path(spec).exists()


def cmd_graph(args: argparse.Namespace) -> int:
    from parplan.cli_args import UsageError
    from parplan.solver.validate import validate_graph
    from parplan.solver.wire import graph_to_json

    if _is_factory(args.model):
        graph = _factory_graph(args.model, args.batch, args.seq_len or 128, args.float_dtype)
    else:
        graph = _model_graph(args.model, args.batch, args.seq_len, args.trace)
    validate_graph(graph)
    text = graph_to_json(graph, indent=1) + "\n"
    if args.out is None:
        sys.stdout.write(text)
    else:
        try:
            Path(args.out).write_text(text)
        except OSError as e:
            raise UsageError(f"cannot write {args.out}: {e.strerror or e}") from None
    units = graph.meta.get("units") or []
    print(f"graph {graph.name}: {len(graph.nodes)} nodes, {graph.parameter_count():,d} parameters, "
          f"{len(units)} units{' to ' + args.out if args.out else ''}", file=sys.stderr)
    return 0


def _model_graph(spec: str, batch: int, seq_len: int | None, trace: bool) -> Graph:
    """A preset's or config's graph: built, or traced (a config without a mapper, or ``trace``)."""
    from parplan.solver.frontends.hf_trace import trace_hf_config
    from parplan.solver.frontends.resize import resize_graph
    from parplan.solver.models import resolve_model

    path = Path(spec)
    if trace and path.suffix == ".json":
        from parplan.cli_args import UsageError

        try:
            cfg = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise UsageError(f"{spec}: not readable JSON ({e})") from None
        if not isinstance(cfg, dict):
            raise UsageError(f"{spec}: expected a JSON object")
        name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
        graph = trace_hf_config(cfg, name, seq_len=seq_len, batch=max(batch, 2))
        return resize_graph(graph, {"batch": batch})
    model = resolve_model(spec, seq_len=seq_len)
    return model.build(batch, seq_len)


def _factory_graph(spec: str, batch: int, seq_len: int, float_dtype: str) -> Graph:
    """Trace ``module:factory``'s module (built on the meta device) on ``batch`` x ``seq_len`` token
    ids (traced at another batch, then resized, where ``batch`` is 1 or equals ``seq_len``); the
    factory may also return ``(module, example_inputs)``, traced as they are (axes of ``batch`` and
    ``seq_len`` elements named ``batch`` and ``seq``)."""
    from parplan.cli_args import UsageError
    from parplan.solver.frontends.hf_trace import import_torch, one_line, trace_model
    from parplan.solver.frontends.resize import resize_graph

    torch = import_torch()
    module_name, _, attr = spec.rpartition(":")
    factory = getattr(_import(module_name), attr, None)
    if not callable(factory):
        raise UsageError(f"{module_name} has no callable {attr!r}")
    try:
        with torch.device("meta"):
            made = factory()
    except Exception as e:  # the user's code: any error, reported on one line
        raise UsageError(f"{spec}() failed: {one_line(e)}") from None
    module, inputs = made if isinstance(made, tuple) and len(made) == 2 else (made, None)
    if not isinstance(module, torch.nn.Module):
        raise UsageError(f"{spec}() returned {type(module).__name__}, not a torch.nn.Module")
    if inputs is not None:
        if batch == 1:
            raise UsageError(f"--batch 1 with the inputs {spec}() returns: a size-1 axis vanishes from the trace; "
                             f"return inputs of two samples (plans resize the graph to their micro-batch)")
        return trace_model(module, inputs, attr, dim_names={batch: "batch", seq_len: "seq"}, float_dtype=float_dtype)
    traced = batch if batch not in (1, seq_len) else next(b for b in (2, 3) if b != seq_len)
    ids = torch.zeros(traced, seq_len, dtype=torch.long, device="meta")
    graph = trace_model(module, (ids,), attr, dim_names={traced: "batch", seq_len: "seq"}, float_dtype=float_dtype)
    return resize_graph(graph, {"batch": batch})


def _import(module_name: str) -> Any:
    """A module by dotted name (the working directory first on the path) or by ``.py`` file path."""
    from parplan.cli_args import UsageError

    try:
        if module_name.endswith(".py"):
            spec = importlib.util.spec_from_file_location(Path(module_name).stem, module_name)
            if spec is None or spec.loader is None or not Path(module_name).is_file():
                raise UsageError(f"no such Python file: {module_name}")
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            return mod
        if "" not in sys.path and str(Path.cwd()) not in sys.path:
            sys.path.insert(0, str(Path.cwd()))
        return importlib.import_module(module_name)
    except UsageError:
        raise
    except Exception as e:  # ImportError, or any error the module raises while it loads
        from parplan.solver.frontends.hf_trace import one_line

        raise UsageError(f"cannot import {module_name}: {one_line(e)}") from None

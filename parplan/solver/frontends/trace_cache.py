"""A disk cache of traced HF configs, so that planning the same ``config.json`` again (another
cluster, another batch) skips importing torch and transformers and tracing (seconds of CPU).

An entry is the graph JSON, named by a SHA-256 of what the trace depends on: the config, the graph
name, the sequence length and batch, whether every layer was traced, the installed torch and
transformers versions, and the source of the tracer itself (so a changed tracer never reads an old
entry). The directory is ``$PARPLAN_TRACE_CACHE`` (``off`` disables the cache), else
``$XDG_CACHE_HOME/parplan/traces``, else ``~/.cache/parplan/traces``. A missing, unreadable or
unwritable entry only means tracing again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from parplan.solver.ir import Graph

#: Environment variable naming the cache directory (``off``: no cache).
CACHE_ENV = "PARPLAN_TRACE_CACHE"
#: Modules whose source the traced graph depends on (besides the ``torch_trace`` package).
_TRACER_MODULES = ("hf_trace.py", "layer_pattern.py", "graph_repeat.py")


def cache_dir() -> Path | None:
    """Where entries live; None when the cache is turned off."""
    chosen = os.environ.get(CACHE_ENV)
    if chosen is not None:
        return None if chosen.strip().lower() in ("off", "0", "") else Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "parplan" / "traces"


def entry_key(cfg: Mapping[str, Any], name: str, seq_len: int, batch: int, every_layer: bool) -> str:
    """The SHA-256 naming the trace of ``cfg`` with these settings."""
    doc = {"config": cfg, "name": name, "seq_len": seq_len, "batch": batch, "every_layer": every_layer,
           "versions": _versions(), "tracer": _tracer_digest()}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()


def load(key: str) -> Graph | None:
    """The cached graph, or None (no entry, or one that does not read back as a graph)."""
    from parplan.solver.errors import GraphValidationError
    from parplan.solver.wire import graph_from_json

    where = cache_dir()
    if where is None:
        return None
    try:
        return graph_from_json((where / f"{key}.json").read_bytes())
    except (OSError, ValueError, GraphValidationError):
        return None


def store(key: str, graph: Graph) -> None:
    """Write the entry (atomically: readers never see half a file); failures are ignored."""
    from parplan.solver.wire import graph_to_json

    where = cache_dir()
    if where is None:
        return
    try:
        where.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=where, suffix=".tmp", delete=False) as f:
            f.write(graph_to_json(graph))
        os.replace(f.name, where / f"{key}.json")
    except OSError:
        return


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for package in ("torch", "transformers"):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = None
    return out


@functools.cache
def _tracer_digest() -> str:
    here = Path(__file__).resolve().parent
    files = sorted((here / "torch_trace").glob("*.py")) + [here / m for m in _TRACER_MODULES]
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()

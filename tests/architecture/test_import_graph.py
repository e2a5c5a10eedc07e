"""The package's import graph, read from the source (every ``import`` statement, also those inside
functions and under ``TYPE_CHECKING``): the service never imports the workers, and no module imports
itself back through others (the CLI's subcommand modules share :mod:`parplan.cli_args`, not
:mod:`parplan.cli`; the trace handlers type their argument as the recorder, not the tracer that calls them)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import parplan

ROOT = Path(parplan.__file__).parent
#: A string naming a workers module (``importlib.import_module("parplan.workers.x")``, a uvicorn
#: factory path): an import in disguise.
WORKERS_PATH = re.compile(r"^parplan\.workers(\.\w+)*(:\w+)?$")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}


def imported(path: Path) -> Iterator[tuple[int, str]]:
    """``(line, module)`` for every import in the file; ``from a import b`` names ``a.b`` when that
    is a module, else ``a``."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield node.lineno, sub if sub in MODULES else base


def test_the_graph_reads_every_module() -> None:
    """The walk finds the modules and their imports (else the tests below would pass on nothing)."""
    assert {"parplan.cli", "parplan.cli_args", "parplan.server", "parplan.service.app", "parplan.workers.tasks"} \
        <= MODULES.keys()
    edges = {m for _, m in imported(MODULES["parplan.server"])}
    assert {"parplan.cli_args", "parplan.service.command_env", "parplan.workers.factory"} <= edges


def test_the_service_never_imports_the_workers() -> None:
    found = []
    for name, path in sorted(MODULES.items()):
        if not name.startswith("parplan.service"):
            continue
        found += [f"{path}:{line}: imports {mod}" for line, mod in imported(path)
                  if mod == "parplan.workers" or mod.startswith("parplan.workers.")]
        found += [f"{path}:{node.lineno}: names {node.value!r}" for node in ast.walk(ast.parse(path.read_text()))
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and WORKERS_PATH.match(node.value)]
    assert not found, "parplan.service must not depend on parplan.workers:\n" + "\n".join(found)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def import_graph() -> dict[str, set[str]]:
    return {name: {m for _, m in imported(path) if m in MODULES and m != name} for name, path in MODULES.items()}


def test_cycles_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    """Imports go one way everywhere in parplan, the solver included (imports inside functions and
    under ``TYPE_CHECKING`` count: each is an edge a reader has to follow)."""
    found = cycles(import_graph())
    assert not found, "modules that import each other:\n" + "\n".join(" <-> ".join(c) for c in found)

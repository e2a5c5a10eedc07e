"""MkDocs hook: the pages written from the code, at every build, so that they cannot go stale.

A page holds a marker ``<!-- generated: NAME -->`` where the text goes:

- ``cli``: the command line's reference, from ``parplan.cli.build_parser()``;
- ``http-api``: the HTTP API's operations and schemas, from the service's OpenAPI document
  (``parplan.server.create_app``), which is also published beside it as ``reference/openapi.json``;
- ``bench:NAME[,NAME...]``: the figures of those benchmarks, from ``bench/out/`` (bench/results_table.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # this checkout's parplan, not an installed copy

MARKER = re.compile(r"<!-- generated: ([\w:,\-]+) -->")


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


# ---- the command line ---------------------------------------------------------------------------


def _usage(parser: argparse.ArgumentParser) -> str:
    fmt = argparse.HelpFormatter(parser.prog, width=100)
    fmt.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return fmt.format_help().strip()


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser, str]]:
    out: list[tuple[str, argparse.ArgumentParser, str]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                out.append((name, sub, helps.get(name, "")))
    return out


def _options(parser: argparse.ArgumentParser) -> str:
    rows = []
    for a in parser._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        name = ", ".join(f"`{s}`" for s in a.option_strings) or f"`{a.metavar or a.dest}`"
        if a.option_strings and a.nargs != 0:
            metavar = a.metavar if a.metavar is not None else a.dest.upper()
            shown = " ".join(metavar) if isinstance(metavar, tuple) else str(metavar)
            if a.choices is None:
                name += f" `{shown}`"
        what = a.help or ""
        if a.choices is not None and not isinstance(a.choices, dict):
            what += (" " if what else "") + "One of " + ", ".join(f"`{c}`" for c in a.choices) + "."
        if a.required and a.option_strings:
            what += " Required."
        default = a.default
        shown_default = "" if default in (None, False, argparse.SUPPRESS) or a.nargs == 0 else f"`{default}`"
        rows.append(f"| {name} | {shown_default} | {_cell(what)} |")
    if not rows:
        return ""
    return "| argument | default | meaning |\n|---|---|---|\n" + "\n".join(rows) + "\n"


def _command(parser: argparse.ArgumentParser, path: str, summary: str, level: int) -> str:
    parts = [f"{'#' * level} `{path}`", ""]
    text = parser.description or summary
    if text:
        parts += [_cell(text), ""]
    parts += ["```text", _usage(parser), "```", "", _options(parser)]
    for name, sub, help_ in _subcommands(parser):
        parts.append(_command(sub, f"{path} {name}", help_, min(level + 1, 4)))
    return "\n".join(parts)


@cache
def cli_reference() -> str:
    """Every command of ``parplan``: its description, usage and arguments, from the parser."""
    from parplan.cli import build_parser

    parser = build_parser()
    index = "\n".join(f"| [`parplan {n}`](#parplan-{n}) | {_cell(h)} |" for n, _, h in _subcommands(parser))
    body = "\n".join(_command(sub, f"parplan {n}", h, 2) for n, sub, h in _subcommands(parser))
    return f"| command | what it does |\n|---|---|\n{index}\n\n{body}"


# ---- the HTTP API -------------------------------------------------------------------------------


@cache
def openapi_document() -> dict[str, Any]:
    """The service's OpenAPI document, from an app on the embedded default (nothing is started)."""
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("PARPLAN_")}
    try:
        with tempfile.TemporaryDirectory() as d:
            os.environ["PARPLAN_DATA_DIR"] = d
            from parplan.server import create_app

            doc: dict[str, Any] = create_app().openapi()
    finally:
        os.environ.pop("PARPLAN_DATA_DIR", None)
        os.environ.update(saved)
    return doc


def _ref(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in schema:
        return " or ".join(_ref(s) for s in schema["anyOf"])
    if schema.get("type") == "array":
        return f"array of {_ref(schema.get('items', {}))}"
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"])
    return str(schema.get("type", "any"))


def _operation(method: str, path: str, op: dict[str, Any]) -> str:
    parts = [f"### `{method.upper()} {path}`", ""]
    if op.get("summary"):
        parts += [f"**{_cell(op['summary'])}**", ""]
    if op.get("description"):
        parts += [op["description"].strip(), ""]
    params = op.get("parameters", [])
    if params:
        parts += ["| parameter | in | type | required | meaning |", "|---|---|---|---|---|"]
        parts += [f"| `{p['name']}` | {p['in']} | {_ref(p.get('schema', {}))} | {'yes' if p.get('required') else ''} "
                  f"| {_cell(p.get('description', ''))} |" for p in params]
        parts.append("")
    body = op.get("requestBody", {}).get("content", {})
    for media, content in body.items():
        parts += [f"Request body ({media}): {_ref(content.get('schema', {}))}", ""]
    parts += ["| status | meaning | body |", "|---|---|---|"]
    for status, resp in op.get("responses", {}).items():
        kinds = ", ".join(f"{_ref(c.get('schema', {}))} ({m})" for m, c in resp.get("content", {}).items())
        parts.append(f"| {status} | {_cell(resp.get('description', ''))} | {kinds} |")
    return "\n".join(parts) + "\n"


def _schema(name: str, schema: dict[str, Any]) -> str:
    parts = [f"### {name}", ""]
    if schema.get("description"):
        parts += [_cell(schema["description"]), ""]
    props = schema.get("properties", {})
    required = set(schema.get("required", []))
    if props:
        parts += ["| field | type | required | meaning |", "|---|---|---|---|"]
        parts += [f"| `{k}` | {_ref(v)} | {'yes' if k in required else ''} | "
                  f"{_cell(v.get('description', v.get('title', '')))} |" for k, v in props.items()]
    elif "enum" in schema:
        parts.append("One of " + ", ".join(f"`{v}`" for v in schema["enum"]) + ".")
    return "\n".join(parts) + "\n"


@cache
def http_reference() -> str:
    """The operations (grouped by tag) and the schemas of the OpenAPI document."""
    doc = openapi_document()
    by_tag: dict[str, list[str]] = {}
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            by_tag.setdefault((op.get("tags") or ["other"])[0], []).append(_operation(method, path, op))
    parts = [f"OpenAPI {doc['openapi']}, `{doc['info']['title']}` {doc['info']['version']}; the document itself: "
             "[openapi.json](openapi.json) (the running service serves it at `/openapi.json`).", ""]
    for tag, ops in by_tag.items():
        parts += [f"## {tag}", "", *ops]
    parts += ["## Schemas", ""]
    parts += [_schema(n, s) for n, s in doc.get("components", {}).get("schemas", {}).items()]
    return "\n".join(parts)


# ---- the benchmarks -----------------------------------------------------------------------------


def bench_sections(names: list[str]) -> str:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import results_table
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return str(results_table.render(names=names, level=3))


def generated(name: str) -> str:
    """The text a marker stands for."""
    if name == "cli":
        return cli_reference()
    if name == "http-api":
        return http_reference()
    if name.startswith("bench:"):
        return bench_sections(name.split(":", 1)[1].split(","))
    raise ValueError(f"unknown generated section {name!r}")


# ---- MkDocs events ------------------------------------------------------------------------------


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    files.append(File.generated(config, "reference/openapi.json",
                                content=json.dumps(openapi_document(), indent=2) + "\n"))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return MARKER.sub(lambda m: generated(m.group(1)), markdown)

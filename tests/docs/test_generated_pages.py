"""The pages docs/hooks.py writes at each build of the site: the CLI reference names every command
and option the parser has, and the HTTP reference every operation and schema of the OpenAPI
document (the build itself, ``mkdocs build --strict``, runs in scripts/test)."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("parplan_docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _parsers(parser: argparse.ArgumentParser, path: str) -> list[tuple[str, argparse.ArgumentParser]]:
    out = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _parsers(sub, f"{path} {name}")
    return out


def test_the_cli_reference_names_every_command_and_option() -> None:
    from parplan.cli import build_parser

    text = _hooks().cli_reference()
    parsers = _parsers(build_parser(), "parplan")
    assert len(parsers) > 10
    for path, parser in parsers[1:]:
        assert f"`{path}`" in text, path
        for action in parser._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}`" in text, (path, flag)


def test_the_http_reference_names_every_operation_and_schema() -> None:
    hooks = _hooks()
    doc = hooks.openapi_document()
    text = hooks.http_reference()
    for path, ops in doc["paths"].items():
        for method in ops:
            assert f"### `{method.upper()} {path}`" in text
    for name in doc["components"]["schemas"]:
        assert f"### {name}\n" in text


def test_a_marker_is_replaced_by_its_generated_text() -> None:
    hooks = _hooks()
    page = "Intro\n\n<!-- generated: bench:search_speed -->\n\nEnd\n"
    out = hooks.on_page_markdown(page, None, None, None)
    assert "<!-- generated" not in out and "### DP search speed" in out and "| commit |" in out

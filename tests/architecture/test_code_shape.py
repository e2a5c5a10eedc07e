"""The code's shape, read from the source: modules of at most 600 lines, functions of at most 80
(the ILP's formulation excepted), code that says what is and why rather than when it changed (no
dates, commit hashes or "before X" stories in ``parplan/``; git keeps the history), and tests named
after what they check."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import parplan

ROOT = Path(parplan.__file__).parent
TESTS = Path(__file__).parents[1]
SOURCES = sorted(ROOT.rglob("*.py"))

MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
#: Functions allowed past :data:`MAX_FUNCTION_LINES`, each with its reason.
LONG_FUNCTIONS = {
    ("parplan/solver/ilp/model.py", "formulate"):
        "the ILP's formulation: one block per variable family and per labelled constraint of the "
        "paper's model, read top to bottom against its equations; cut into pieces, the constraints "
        "would lose the variables they share",
}

#: A calendar date (``2026-11-23``), unless it is part of a path or URL (``bench/out/gpu-2026-11-23/``).
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
#: "before 2026", "until 2025-03", "as of 2024": a change told by its date.
DATED_CHANGE = re.compile(r"\b(?:before|until|since|as of)\s+20\d\d\b", re.IGNORECASE)
#: A change told by its commit: "before 42897c6", "fixed in 0a1b2c3d".
COMMIT_REF = re.compile(r"\b(?:commit|since|before|until|after|fixed in|as of|at)\s+([0-9a-f]{7,40})\b",
                        re.IGNORECASE)
#: A change told by the code it replaced: "+0.5% before this was counted", "before the fix".
CHANGE_STORY = re.compile(r"\b(?:before|until)\s+(?:this|the)\s+(?:was|were|change|fix|commit|patch|split)\b",
                          re.IGNORECASE)
#: A run of hex digits standing alone in a comment or docstring, as a commit hash does (not an
#: ``0x`` constant, a UUID's group, a number like ``1125e12``, or part of a word or path).
HEX_RUN = re.compile(r"(?<![\w.+/-])[0-9a-f]{7,40}(?![\w/-])")
SCIENTIFIC = re.compile(r"\d+e\d+")
#: A line naming its source by URL or release tag may pin that source's commit (provenance).
PROVENANCE = re.compile(r"https?://|\bv\d+(?:\.\d+)+\b")


def rel(path: Path) -> str:
    return path.relative_to(ROOT.parent).as_posix()


def functions(tree: ast.AST) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """``(qualified name, node)`` for every function and method, nested ones included."""
    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                yield prefix + child.name, child
                yield from walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)
    yield from walk(tree, "")


def function_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from ``def`` to the last line of the body (decorators not counted)."""
    assert node.end_lineno is not None
    return node.end_lineno - node.lineno + 1


def long_functions(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(), str(path))
    return [(name, function_lines(node)) for name, node in functions(tree)
            if function_lines(node) > MAX_FUNCTION_LINES]


def prose(source: str) -> Iterator[tuple[int, str]]:
    """``(line, text)`` of every comment and docstring, one entry per line."""
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                for i, line in enumerate(source.splitlines()[first.lineno - 1:first.end_lineno]):
                    yield first.lineno + i, line


def looks_like_a_hash(run: str) -> bool:
    return any(c.isdigit() for c in run) and any(c.isalpha() for c in run) and not SCIENTIFIC.fullmatch(run)


def history(source: str) -> list[tuple[int, str]]:
    """``(line, what)`` for every date, dated change, commit reference or change story in the text
    (code, strings and comments alike), and every hash-like hex run in its comments and docstrings."""
    found: list[tuple[int, str]] = []
    hashes: set[tuple[int, str]] = set()
    lines = source.splitlines()
    for n, line in enumerate(lines, 1):
        for m in DATE.finditer(line):
            start, end = line.rfind(" ", 0, m.start()) + 1, line.find(" ", m.end())
            if "/" not in line[start:end if end >= 0 else len(line)]:  # a date naming a path is a source
                found.append((n, f"date {m.group()!r}"))
        found += [(n, f"dated change {m.group()!r}") for m in DATED_CHANGE.finditer(line)]
        found += [(n, f"change story {m.group()!r}") for m in CHANGE_STORY.finditer(line)]
        if not PROVENANCE.search(line):
            for m in COMMIT_REF.finditer(line):
                if looks_like_a_hash(m.group(1).lower()):
                    found.append((n, f"commit reference {m.group()!r}"))
                    hashes.add((n, m.group(1)))
    for n, text in prose(source):
        if not PROVENANCE.search(lines[n - 1]):
            found += [(n, f"hash-like {m.group()!r}") for m in HEX_RUN.finditer(text)
                      if looks_like_a_hash(m.group()) and (n, m.group()) not in hashes]
    return sorted(set(found))


#: Words that name a test after the code's past rather than what it checks.
HISTORY_NAME = re.compile(
    r"(?:^|(?<=_))(?:"
    r"(?:pre|post)_(?:split|refactor|rewrite|change|fix|merge)"
    r"|as_before|as_it_was|like_before|as_today"
    r"|legacy|formerly|previously|regression|no_longer|used_to|anymore"
    r"|(?:old|new)_(?:key|keys|tracers?|code|path|behaviou?r|version|implementation|presets?|format|rules?)"
    r"|(?:the_)?issue_?\d*_?(?:case|command|example|report)|(?:issue|pr|bug)_?\d+"
    r"|20[0-3]\d|[0-9a-f]*\d[a-f][0-9a-f]*|[0-9a-f]*[a-f]\d[0-9a-f]*"
    r")(?=_|$)")


def history_named(name: str) -> str | None:
    """The history word in a test's name, if any (a year, or a hex run of 7 digits or more)."""
    for m in HISTORY_NAME.finditer(name):
        word = m.group()
        if re.fullmatch(r"[0-9a-f]{1,6}", word) and not re.fullmatch(r"20[0-3]\d", word):
            continue
        return word
    return None


def test_the_walks_read_every_module() -> None:
    """The checks below run over every source file (else they would pass on nothing)."""
    assert len(SOURCES) > 100
    assert ROOT / "solver" / "ilp" / "model.py" in SOURCES
    names = dict(functions(ast.parse((ROOT / "solver" / "ilp" / "model.py").read_text())))
    assert "formulate" in names


def test_the_checks_catch_what_they_are_for() -> None:
    """Each check against text it must flag and text it must let through."""
    code = (
        "def f():\n"
        '    """Priced apart since 2026-11-28; before 42897c6 it took 0.60."""\n'
        "    x = 0x7fffffff  # the largest int32\n"
        "    # 0.5% more before this was counted; fixed in deadbee1\n"
        "    # measured at 1125e12 FLOP/s; job 550e8400-e29b-41d4 ran (bench/out/gpu-2026-11-23/k.json)\n"
        "    # pinned at 0ab3c9f (see f00dcafe12)\n"
        "    return x  # v2.4.0 of owner/repo, commit 498bcad; torch 2.13\n"
    )
    assert history(code) == [
        (2, "commit reference 'before 42897c6'"), (2, "date '2026-11-28'"), (2, "dated change 'since 2026'"),
        (4, "change story 'before this was'"), (4, "commit reference 'fixed in deadbee1'"),
        (6, "commit reference 'at 0ab3c9f'"), (6, "hash-like 'f00dcafe12'"),
    ]
    assert history("# Before 2025 the rule was\n") == [(1, "dated change 'Before 2025'")]
    assert not history("TOKEN = 'deadbeef1234'  # a constant in code, not prose\n")

    body = "        x = 1\n" * (MAX_FUNCTION_LINES - 2)
    (name, node), = functions(ast.parse(f"class C:\n    @staticmethod\n    def g():\n{body}        return x\n"))
    assert (name, function_lines(node)) == ("C.g", MAX_FUNCTION_LINES)

    assert history_named("test_traced_graphs_are_the_pre_split_tracers") == "pre_split"
    assert history_named("test_an_8_gpu_server_is_one_launcher_node_as_before") == "as_before"
    assert history_named("test_the_issue_case_bert_large_is_not_dominated") == "the_issue_case"
    assert history_named("test_bug_1234_stays_fixed") == "bug_1234"
    assert history_named("test_fixed_at_42897c6") == "42897c6"
    assert history_named("test_gradients_are_not_held_before_backward") is None
    assert history_named("test_a_job_requeued_while_its_old_attempt_winds_down") is None
    assert history_named("test_every_issue_is_reported_not_just_the_first") is None
    assert history_named("test_fp8_e4m3_casts") is None


def test_no_module_over_600_lines() -> None:
    found = [f"{rel(p)}: {n} lines" for p in SOURCES if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not found, f"modules over {MAX_MODULE_LINES} lines (split them by what they do):\n" + "\n".join(found)


def test_no_function_over_80_lines() -> None:
    found = []
    for path in SOURCES:
        found += [f"{rel(path)}: {name} ({n} lines)" for name, n in long_functions(path)
                  if (rel(path), name) not in LONG_FUNCTIONS]
    assert not found, f"functions over {MAX_FUNCTION_LINES} lines (cut them into named steps):\n" + "\n".join(found)


def test_the_long_function_allowed_is_still_long() -> None:
    """An exemption that no longer applies goes (else it would cover whatever grows there next)."""
    for path, name in LONG_FUNCTIONS:
        assert name in dict(long_functions(ROOT.parent / path)), f"{path}: {name} is short now; drop its exemption"


def test_no_history_in_the_sources() -> None:
    """Dates, commit hashes and "before X" stories belong in git; a figure's provenance is one
    line naming its source (a file, a paper, a URL or release tag)."""
    found = []
    for path in SOURCES:
        found += [f"{rel(path)}:{n}: {what}" for n, what in history(path.read_text())]
    assert not found, "history in the sources (say what is and why):\n" + "\n".join(found)


def test_no_test_named_after_history() -> None:
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_")
                    and (word := history_named(node.name))):
                found.append(f"{path.relative_to(TESTS.parent).as_posix()}:{node.lineno}: {node.name} ({word})")
    assert not found, "tests named after the code's past (name what they check):\n" + "\n".join(found)

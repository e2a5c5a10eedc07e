"""The documented examples: every ``console`` block of README.md and docs/**/*.md, run again.

Convention: a fenced block opened with ```` ```console ```` holds commands, each on a line starting
with ``$ parplan ``, each followed by the text it prints (stdout and stderr as they come). A
command may end with ``> FILE``: what it prints goes to FILE instead (nothing is shown under it).
The commands of one page run in order, in one scratch directory, so a later one can read what an
earlier one wrote. A command that exits non-zero shows ``[exit status N]`` as its last line. Any
other fenced block (```` ```bash ````, ```` ```text ````) is not run.

Wall-clock figures are masked (MASKS): the text shows ``…`` where a duration was printed.

Rewrite the outputs in place after a change of wording (then read the diff):
    python tests/docs/doc_examples.py            # every page
    python tests/docs/doc_examples.py README.md  # one page
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: (pattern, replacement) applied to every printed line: the solve's wall-clock time.
MASKS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^(solver\s.*: \w+), \d+(\.\d+)? s$"), r"\1, … s"),
)

_FENCE = re.compile(r"^(\s*)```console\s*$")


@dataclass(frozen=True)
class Example:
    """One command of a page: where it is (the line of its ``$``), the command and the text shown."""

    line: int
    command: str
    shown: str


@dataclass(frozen=True)
class Block:
    """A console block: the lines it spans (after the opening fence, before the closing one)."""

    start: int
    end: int
    examples: tuple[Example, ...]


def pages() -> list[Path]:
    """The pages whose examples are checked: README.md and every Markdown page under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(text: str) -> list[Block]:
    """The console blocks of a page, with their examples."""
    lines = text.split("\n")
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent = m.group(1)
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        body = [x[len(indent):] if x.startswith(indent) else x for x in lines[i + 1:j]]
        out.append(Block(i + 1, j, _examples(body, i + 1)))
        i = j + 1
    return out


def _examples(body: list[str], first: int) -> tuple[Example, ...]:
    found: list[Example] = []
    k = 0
    while k < len(body):
        if not body[k].startswith("$ "):
            raise ValueError(f"line {first + k + 1}: a console block's text must follow a `$ parplan ...` line")
        n = k + 1
        while n < len(body) and not body[n].startswith("$ "):
            n += 1
        found.append(Example(first + k + 1, body[k][2:], "\n".join(body[k + 1:n])))
        k = n
    return tuple(found)


def mask(text: str) -> str:
    out = []
    for line in text.split("\n"):
        for pattern, repl in MASKS:
            line = pattern.sub(repl, line)
        out.append(line)
    return "\n".join(out)


def run(command: str) -> str:
    """Run one documented command in-process in the current directory: the text it prints."""
    from parplan.cli import main

    argv = shlex.split(command)
    target = None
    if len(argv) >= 2 and argv[-2] == ">":
        target, argv = argv[-1], argv[:-2]
    if not argv or argv[0] != "parplan":
        raise ValueError(f"a documented command runs parplan, not {command!r}")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            status = main(argv[1:])
        except SystemExit as e:  # argparse's usage errors
            status = e.code if isinstance(e.code, int) else 1
    printed = buf.getvalue()
    if target is not None:
        Path(target).write_text(printed)
        printed = ""
    printed = mask(printed.rstrip("\n"))
    if status:
        printed += ("\n" if printed else "") + f"[exit status {status}]"
    return printed


def run_page(path: Path) -> list[tuple[Example, str]]:
    """Every example of a page with what it prints now, run in order in one scratch directory."""
    results: list[tuple[Example, str]] = []
    saved = Path.cwd()
    with tempfile.TemporaryDirectory(prefix="parplan-docs-") as scratch:
        os.chdir(scratch)
        try:
            for block in blocks(path.read_text()):
                for ex in block.examples:
                    results.append((ex, run(ex.command)))
        finally:
            os.chdir(saved)
    return results


def update(path: Path) -> int:
    """Rewrite a page's outputs with what its commands print now; the number of outputs changed."""
    text = path.read_text()
    lines = text.split("\n")
    fresh = {ex.line: (ex, now) for ex, now in run_page(path)}
    changed = 0
    for block in reversed(blocks(text)):
        indent = re.match(r"^(\s*)", lines[block.start - 1]).group(1)  # type: ignore[union-attr]
        new: list[str] = []
        for ex in block.examples:
            _, now = fresh[ex.line]
            changed += now != ex.shown
            new += [indent + "$ " + ex.command] + [(indent + x) if x else x for x in now.split("\n") if now]
        lines[block.start:block.end] = new
    path.write_text("\n".join(lines))
    return changed


def main(argv: list[str]) -> int:
    targets = [Path(a).resolve() for a in argv] or pages()
    for p in targets:
        n = update(p)
        print(f"{p.relative_to(ROOT)}: {n} output(s) rewritten")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main(sys.argv[1:]))

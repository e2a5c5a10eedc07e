"""Every command shown in README.md and docs/ prints what the page says it prints (doc_examples.py
states the convention). After a change of wording, rewrite the outputs and read the diff:
``python tests/docs/doc_examples.py`` (or ``PARPLAN_UPDATE_DOC_EXAMPLES=1 pytest tests/docs``)."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest
from doc_examples import ROOT, blocks, mask, pages, run_page, update

WITH_EXAMPLES = [p for p in pages() if any(b.examples for b in blocks(p.read_text()))]


@pytest.mark.parametrize("page", WITH_EXAMPLES, ids=[str(p.relative_to(ROOT)) for p in WITH_EXAMPLES])
def test_documented_commands_print_what_the_page_shows(page: Path) -> None:
    if os.environ.get("PARPLAN_UPDATE_DOC_EXAMPLES") == "1":
        update(page)
    wrong = []
    for ex, now in run_page(page):
        if now != ex.shown:
            diff = "\n".join(difflib.unified_diff(ex.shown.split("\n"), now.split("\n"), "shown", "printed now",
                                                  lineterm=""))
            wrong.append(f"{page.relative_to(ROOT)}:{ex.line}: $ {ex.command}\n{diff}")
    assert not wrong, ("\n\n".join(wrong) + "\n\nrewrite them with: python tests/docs/doc_examples.py "
                       f"{page.relative_to(ROOT)}")


def test_the_readme_and_the_quickstart_show_run_examples() -> None:
    assert ROOT / "README.md" in WITH_EXAMPLES
    assert ROOT / "docs" / "quickstart.md" in WITH_EXAMPLES


def test_a_stale_output_is_found_and_rewritten(tmp_path: Path) -> None:
    """The check can fail: a page whose output differs from the command's is reported, and the
    update mode rewrites it to what the command prints (masking the wall-clock)."""
    page = tmp_path / "page.md"
    page.write_text("Intro\n\n```console\n$ parplan models --json > models.json\n$ parplan export missing.json "
                    "--target megatron\nan old message\n```\n\nEnd\n")
    (ex_file, now_file), (ex_err, now_err) = run_page(page)
    assert now_file == "" == ex_file.shown
    assert ex_err.shown == "an old message" != now_err
    assert now_err.endswith("[exit status 2]") and "missing.json" in now_err
    assert update(page) == 1
    assert [now for _, now in run_page(page)] == ["", now_err]
    assert page.read_text().startswith("Intro\n\n```console\n$ parplan models --json > models.json\n$ parplan export")
    assert page.read_text().endswith("\n```\n\nEnd\n")


def test_a_console_block_holds_only_parplan_commands(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```console\noutput without a command\n```\n")
    with pytest.raises(ValueError, match="must follow"):
        blocks(page.read_text())
    page.write_text("```console\n$ ls -l\n```\n")
    with pytest.raises(ValueError, match="runs parplan"):
        run_page(page)


def test_the_solve_time_is_masked() -> None:
    assert mask("solver    dp (auto: one node): optimal, 4.71 s") == "solver    dp (auto: one node): optimal, … s"
    assert mask("step time 0.154 s, 106,054 tokens/s") == "step time 0.154 s, 106,054 tokens/s"


def test_the_readme_is_a_landing_page() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200

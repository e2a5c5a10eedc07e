"""bench/RESULTS.md is the benchmarks' outputs in bench/out/ rendered by bench/results_table.py,
so its figures are the current ones: regenerate it with ``python bench/results_table.py``."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import results_table  # noqa: E402

sys.path.remove(str(ROOT / "bench"))


def test_results_md_is_bench_out_rendered() -> None:
    assert (ROOT / "bench" / "RESULTS.md").read_text() == results_table.results_md(), (
        "bench/RESULTS.md is stale: run python bench/results_table.py")


def test_every_output_has_its_section_with_command_date_commit_and_machine() -> None:
    text = results_table.results_md()
    for b in results_table.benchmarks():
        assert f"## {b.title}\n" in text
        for key in ("command", "date", "commit", "machine"):
            assert key in b.fields, f"bench/out/{b.name}.txt has no {key} line"
            assert f"| {key} | {b.fields[key].replace('|', '/')} |" in text
    assert len(results_table.benchmarks()) == len(list((ROOT / "bench" / "out").glob("*.txt")))


def test_a_new_figure_changes_the_rendering(tmp_path: Path) -> None:
    """The check can fail: a benchmark rerun (a new date and figure) gives another RESULTS.md."""
    out = tmp_path / "out"
    shutil.copytree(ROOT / "bench" / "out", out, ignore=shutil.ignore_patterns("gpu-*"))
    before = results_table.results_md(out)
    path = out / "search_speed.txt"
    text = path.read_text().replace("date: ", "date: 2099-01-01 00:00 UTC was ", 1)
    text, n = re.subn(r"(\| gpt-7\.5b \| 8 \| A100-80GB \| )[0-9.]+ \|", r"\g<1>99.99 |", text, count=1)
    assert n == 1  # the first case's search seconds, whatever they were
    path.write_text(text)
    after = results_table.results_md(out)
    assert after != before and "2099-01-01" in after and "| 99.99 |" in after

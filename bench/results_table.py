"""Writes bench/RESULTS.md from the benchmarks' outputs in bench/out/: for each benchmark its
current figures and where they come from (command, date, commit, machine), one section each.

Usage (from the repository root):
    python bench/results_table.py            # rewrite bench/RESULTS.md
    python bench/results_table.py --check    # exit 1 when bench/RESULTS.md is not a fresh generation

Each output file starts with the header ``_common.header`` writes (older ones spell its keys with
padding); its body is copied: Markdown tables as they are, fixed-width text in a text block.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
RESULTS = HERE / "RESULTS.md"
KEYS = ("command", "date", "commit", "machine", "packages")
_KEY_LINE = re.compile(r"^(command|date|commit|machine|packages):\s*(.*?)\s*$")

#: The benchmarks in the order RESULTS.md shows them, each with what it measures. A file in
#: bench/out/ missing here is shown after these, under its own title.
ORDER: dict[str, str] = {
    "model_accuracy": "memory predicted against memory measured, per category, on CPU (gloo) runs of every kind "
                      "of strategy",
    "ilp_plan_accuracy": "memory of ILP plans executed with DTensor, against their prediction",
    "gloo_held_gathers": "the gloo all-gather outputs that outlive their call, and what they add to a peak",
    "time_model_accuracy": "step time predicted against published training runs",
    "memory_accuracy_published": "allocated and reserved peaks and the fit verdict against the published memory of "
                                 "multi-GPU training runs",
    "kernel_model_accuracy": "the kernel time model against kernels timed on an H100",
    "reprice_gpu_single": "single-GPU H100 runs, their measured step time against today's prediction",
    "paper_table2": "the memory-redundancy paper's Table 2 in parplan's cost model",
    "speed_goals": "the whole `parplan plan` command against its speed goals",
    "search_speed": "the per-layer DP search",
    "ilp_solve_time": "the ILP search",
    "target_speed": "planning for a target trainer",
    "plan_vs_tuned": "parplan's max-throughput plans (targets megatron and any) against the best uniform "
                     "Megatron-LM configuration of an exhaustive grid, predicted",
    "offload_fewest_gpus": "the fewest GPUs a model fits on with and without the optimizer offloaded to the host, "
                           "and the slowdown",
    "traced_plan_speed": "planning a traced config.json against its preset",
    "load_presets": "loading and evaluating the largest presets",
    "service_load": "the planning service under load",
    "capacity_sweep": "a capacity sweep's wall time on 1 and 2 Celery workers, and cached",
}


@dataclass(frozen=True)
class Benchmark:
    """One output file: its name (the script's), title, header fields and body."""

    name: str
    title: str
    fields: dict[str, str]
    body: str


def parse(path: Path) -> Benchmark:
    """The header fields (first value of each key), the title (the first ``## `` line, else the
    file's first line when it is not a header field, else what ORDER says it measures) and the body (the rest:
    header lines and the first title removed, later titles made sub-headings)."""
    lines = path.read_text().splitlines()
    fields: dict[str, str] = {}
    title = ""
    body: list[str] = []
    for i, line in enumerate(lines):
        m = _KEY_LINE.match(line.rstrip())
        if m:
            value = m.group(2).strip()
            if m.group(1) == "command":
                value = value.strip("`")
            fields.setdefault(m.group(1), value)
            continue
        if line.startswith("## "):
            if not title:
                title = line[3:].strip()
            else:
                body.append("#### " + line[3:].strip())
            continue
        if i == 0 and not title and line.strip():
            title = line.strip()
            continue
        body.append(line.rstrip())
    text = "\n".join(body).strip("\n")
    fallback = ORDER.get(path.stem, path.stem)
    return Benchmark(path.stem, title or fallback[0].upper() + fallback[1:], fields, text)


def is_markdown(body: str) -> bool:
    """Whether the body is Markdown (it holds a table), not fixed-width text."""
    return any(re.match(r"^\|[-:| ]+\|$", line) for line in body.splitlines())


def benchmarks(out: Path = OUT) -> list[Benchmark]:
    """Every ``*.txt`` output in ``out``, in ORDER's order, the others after by name."""
    found = {p.stem: p for p in sorted(out.glob("*.txt"))}
    names = [n for n in ORDER if n in found] + [n for n in found if n not in ORDER]
    return [parse(found[n]) for n in names]


def section(b: Benchmark, level: int = 2) -> str:
    """A benchmark's section: title, what it measures, its header as a table, its figures."""
    h = "#" * level
    rows = "\n".join(f"| {k} | {b.fields[k].replace('|', '/')} |" for k in KEYS if k in b.fields)
    about = ORDER.get(b.name, "")
    body = b.body if is_markdown(b.body) else f"```text\n{b.body}\n```"
    body = body.replace("\n#### ", "\n" + "#" * (level + 1) + " ")
    parts = [f"{h} {b.title}", ""]
    if about:
        parts += [f"`bench/out/{b.name}.txt`: {about}.", ""]
    parts += ["| | |", "|---|---|", rows, "", body, ""]
    return "\n".join(parts)


def render(out: Path = OUT, names: list[str] | None = None, level: int = 2) -> str:
    """The sections of the named benchmarks (all when None), one after the other."""
    chosen = [b for b in benchmarks(out) if names is None or b.name in names]
    return "\n".join(section(b, level) for b in chosen)


def results_md(out: Path = OUT) -> str:
    """bench/RESULTS.md: an index of the benchmarks (name, date, commit), then their sections."""
    bs = benchmarks(out)
    index = "\n".join(f"| [{b.title}](#{anchor(b.title)}) | `{b.name}` | {b.fields.get('date', '?')} | "
                      f"{b.fields.get('commit', '?')} |" for b in bs)
    data = sorted(p.name for p in out.iterdir() if p.is_dir())
    head = ("# Measured results\n\n"
            "The current figure of each benchmark, written by `python bench/results_table.py` from the outputs in "
            "`bench/out/` (do not edit by hand: rerun a benchmark with its command, then this script). Each section "
            "names the command, date, commit and machine its figures come from. The lab notes that explain them are "
            "in `docs/notes/`.\n\n"
            "| benchmark | output | date | commit |\n|---|---|---|---|\n" + index + "\n\n"
            "Raw measurements taken on lent GPUs (JSON, read by the benchmarks above): "
            + ", ".join(f"`bench/out/{d}/`" for d in data) + ".\n\n")
    return head + render(out)


def anchor(title: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with bench/RESULTS.md instead of writing it")
    args = ap.parse_args(argv)
    text = results_md()
    if args.check:
        if RESULTS.read_text() != text:
            print("bench/RESULTS.md is not bench/out/ rendered: run python bench/results_table.py", file=sys.stderr)
            return 1
        return 0
    RESULTS.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

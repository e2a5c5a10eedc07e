"""Whole ``parplan plan`` from a traced full-size HF config against the same model's preset.

Runs each command ``--repeat`` times, alternating, and reports the CPU time of the child process
(user + system, from ``resource.getrusage(RUSAGE_CHILDREN)``; robust on a loaded machine, unlike
wall time, which is reported too). Cases: the preset; the config traced (``--trace``: Qwen2 has a
hand-written mapper); the graph JSON ``parplan graph --trace`` writes (what is left once the graph
exists); and ``parplan graph --trace`` alone.

    python bench/traced_plan_speed.py [--repeat 3] [--search dp]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import header

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "tests" / "data" / "hf" / "qwen2.5-72b.json"
PRESET = "qwen2.5-72b"
CLUSTER = ["--gpus", "64", "--gpus-per-node", "8", "--gpu", "H100-80GB", "--seq-len", "4096"]


def run(argv: list[str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one child command; exits if it fails."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        sys.exit(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--search", choices=["dp", "ilp"], default="dp")
    args = ap.parse_args()
    parplan = str(Path(sys.executable).parent / "parplan")
    plan = [parplan, "plan", *CLUSTER, "--search", args.search]
    title = header(f"Planning Qwen2.5-72B from a traced config.json against its preset ({args.search})")
    with tempfile.TemporaryDirectory() as tmp:
        graph = str(Path(tmp) / "qwen2.5-72b.graph.json")
        cases = {
            f"preset `--model {PRESET}`": [*plan, "--model", PRESET],
            "traced config `--model qwen2.5-72b.json --trace`": [*plan, "--model", str(CONFIG), "--trace"],
            "`parplan graph --trace` (tracing alone)": [parplan, "graph", str(CONFIG), "--trace", "--seq-len", "4096",
                                                        "--out", graph],
            "graph JSON `--model qwen2.5-72b.graph.json`": [*plan, "--model", graph],
        }
        times: dict[str, list[tuple[float, float]]] = {case: [] for case in cases}
        for _ in range(args.repeat):
            for case, argv in cases.items():
                times[case].append(run(argv))
    print(title)
    print(f"\ncluster: {' '.join(CLUSTER)}, `--search {args.search}`; {args.repeat} runs each, alternating\n")
    print("| case | CPU s (min) | CPU s (all) | wall s (min) | CPU vs preset |")
    print("|---|---:|---:|---:|---:|")
    base = min(c for c, _ in times[next(iter(cases))])
    for case, runs in times.items():
        cpu = min(c for c, _ in runs)
        print(f"| {case} | {cpu:.2f} | {', '.join(f'{c:.2f}' for c, _ in runs)} | {min(w for _, w in runs):.2f} "
              f"| {cpu / base:.1f}x |")


if __name__ == "__main__":
    main()

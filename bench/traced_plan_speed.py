"""Whole ``parplan plan`` from a traced full-size HF config against the same model's preset.

Runs each command ``--repeat`` times, alternating, and reports the CPU time of the child process
(user + system, from ``resource.getrusage(RUSAGE_CHILDREN)``; robust on a loaded machine, unlike
wall time, which is reported too). Cases: the preset; the config traced (``--trace``: Qwen2 has a
hand-written mapper) with the trace cache off, and again with it warm; the graph JSON ``parplan
graph --trace`` writes; and ``parplan graph --trace`` alone (cache off). These whole-command
figures are issue 13's criterion.

A second table is a long-lived process (a service worker): one child process imports parplan,
torch, transformers and the model's modeling module once, then plans the preset and the traced
config (trace cache off) in turn, ``--repeat`` times each, in-process; it reports the CPU time of
each plan (``time.process_time``) after those imports. The first traced plan of the process also
pays torch.export's one-time set-up; it is reported apart from the later ones.

    python bench/traced_plan_speed.py [--repeat 3] [--search dp]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import header

from parplan.solver.frontends.trace_cache import CACHE_ENV

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "tests" / "data" / "hf" / "qwen2.5-72b.json"
PRESET = "qwen2.5-72b"
CLUSTER = ["--gpus", "64", "--gpus-per-node", "8", "--gpu", "H100-80GB", "--seq-len", "4096"]


def run(argv: list[str], cache: str) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one child command with the trace cache ``cache``; exits if it
    fails."""
    env = {**os.environ, CACHE_ENV: cache}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        sys.exit(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def warm_child(repeat: int, search: str) -> None:
    """In this process: import once, then plan the preset and the traced config in turn; print JSON
    ``{"imports": s, "preset": [s...], "traced": [s...]}`` (CPU seconds of each step)."""
    os.environ[CACHE_ENV] = "off"
    start = time.process_time()
    from parplan.cli import main as cli_main

    importlib.import_module("torch")
    importlib.import_module("transformers")
    model_type = json.loads(CONFIG.read_text())["model_type"]
    importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    importlib.import_module("torch.export")
    imports = time.process_time() - start
    plan = ["plan", *CLUSTER, "--search", search]
    cases = {"preset": [*plan, "--model", PRESET], "traced": [*plan, "--model", str(CONFIG), "--trace"]}
    times: dict[str, list[float]] = {case: [] for case in cases}
    for _ in range(repeat):
        for case, argv in cases.items():
            start = time.process_time()
            with contextlib.redirect_stdout(io.StringIO()):
                code = cli_main(argv)
            times[case].append(time.process_time() - start)
            if code:
                sys.exit(f"parplan {' '.join(argv)} exited with {code}")
    print(json.dumps({"imports": imports, **times}))


def warm_table(repeat: int, search: str) -> str:
    """The long-lived process's table (markdown), from one child process running :func:`warm_child`."""
    done = subprocess.run([sys.executable, __file__, "--warm-child", "--repeat", str(max(repeat, 2)), "--search",
                           search], capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"warm child failed: {done.stderr.strip()}")
    t = json.loads(done.stdout.strip().splitlines()[-1])
    preset = min(t["preset"])
    first, later = t["traced"][0], min(t["traced"][1:])
    rows = [("preset `--model qwen2.5-72b`", preset, t["preset"]),
            ("traced config, no cache: first in the process (torch.export's set-up)", first, t["traced"][:1]),
            ("traced config, no cache: later ones", later, t["traced"][1:])]
    out = [f"\nOne long-lived process (a worker), after importing parplan, torch, transformers and the modeling "
           f"module once ({t['imports']:.2f} s of CPU, not counted below); {len(t['preset'])} plans each, "
           f"alternating, in-process, `--search {search}`, trace cache off:\n",
           "| case (warm process) | CPU s (min) | CPU s (all) | CPU vs preset |", "|---|---:|---:|---:|"]
    for case, best, runs in rows:
        out.append(f"| {case} | {best:.2f} | {', '.join(f'{c:.2f}' for c in runs)} | {best / preset:.1f}x |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--search", choices=["dp", "ilp"], default="dp")
    ap.add_argument("--warm-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.warm_child:
        warm_child(args.repeat, args.search)
        return
    parplan = str(Path(sys.executable).parent / "parplan")
    plan = [parplan, "plan", *CLUSTER, "--search", args.search]
    title = header(f"Planning Qwen2.5-72B from a traced config.json against its preset ({args.search})")
    with tempfile.TemporaryDirectory() as tmp:
        graph = str(Path(tmp) / "qwen2.5-72b.graph.json")
        cases = {
            f"preset `--model {PRESET}`": [*plan, "--model", PRESET],
            "traced config `--model qwen2.5-72b.json --trace`, no cache": [*plan, "--model", str(CONFIG), "--trace"],
            "traced config, again (trace cache warm)": [*plan, "--model", str(CONFIG), "--trace"],
            "`parplan graph --trace` (tracing alone)": [parplan, "graph", str(CONFIG), "--trace", "--seq-len", "4096",
                                                        "--out", graph],
            "graph JSON `--model qwen2.5-72b.graph.json`": [*plan, "--model", graph],
        }
        warm = str(Path(tmp) / "trace-cache")
        run(cases["traced config, again (trace cache warm)"], warm)  # fills the cache
        times: dict[str, list[tuple[float, float]]] = {case: [] for case in cases}
        for _ in range(args.repeat):
            for case, argv in cases.items():
                times[case].append(run(argv, warm if "warm" in case else "off"))
    print(title)
    print(f"\ncluster: {' '.join(CLUSTER)}, `--search {args.search}`; {args.repeat} runs each, alternating\n")
    print("| case | CPU s (min) | CPU s (all) | wall s (min) | CPU vs preset |")
    print("|---|---:|---:|---:|---:|")
    base = min(c for c, _ in times[next(iter(cases))])
    for case, runs in times.items():
        cpu = min(c for c, _ in runs)
        print(f"| {case} | {cpu:.2f} | {', '.join(f'{c:.2f}' for c, _ in runs)} | {min(w for _, w in runs):.2f} "
              f"| {cpu / base:.1f}x |")
    print(warm_table(args.repeat, args.search))


if __name__ == "__main__":
    main()

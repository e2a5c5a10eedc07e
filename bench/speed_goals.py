"""Issue 10's speed table: the whole ``parplan plan`` command, as a user runs it, per goal.

Each case is run as a fresh process (interpreter start, imports, graph building, the search, the
baselines, the certificate, printing the JSON document) and timed from outside. The work the
searches report (``solver.work``) is printed beside the time, so a figure can be told from noise.
Run: python bench/speed_goals.py [--repeat N] [--only SUBSTR]

The package's bytecode is compiled first and the commands run with bytecode caching on, as an
installed package runs (``PYTHONDONTWRITEBYTECODE`` is removed from their environment): where it is
set, as on the CI machine's shell, every command would otherwise compile parplan's sources again
(about 0.3 s).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import subprocess
import sys
import time

from _common import header

PARPLAN = os.path.join(os.path.dirname(sys.executable), "parplan")

#: (label, arguments of ``parplan plan``, goal in seconds)
CASES: list[tuple[str, list[str], float]] = [
    ("gpt-7.5b, 8 GPUs, ILP min-memory, batch 16",
     ["--model", "gpt-7.5b", "--gpus", "8", "--gpu", "A100-80GB", "--global-batch", "16", "--search", "ilp",
      "--objective", "min-memory"], 2.0),
    ("gpt-7.5b, 8 GPUs, ILP min-memory, batch 64",
     ["--model", "gpt-7.5b", "--gpus", "8", "--gpu", "A100-80GB", "--global-batch", "64", "--search", "ilp",
      "--objective", "min-memory"], 2.0),
    ("bert-large, 8 GPUs, ILP min-memory, batch 16",
     ["--model", "bert-large", "--gpus", "8", "--gpu", "A100-80GB", "--global-batch", "16", "--search", "ilp",
      "--objective", "min-memory"], 10.0),
    ("t5-11b, 8 GPUs, ILP min-memory, batch 16",
     ["--model", "t5-11b", "--gpus", "8", "--gpu", "A100-80GB", "--global-batch", "16", "--search", "ilp",
      "--objective", "min-memory"], 10.0),
    ("llama-2-70b, 64 GPUs, ILP min-memory, batch 128",
     ["--model", "llama-2-70b", "--gpus", "64", "--gpus-per-node", "8", "--gpu", "H100-80GB", "--global-batch", "128",
      "--search", "ilp", "--objective", "min-memory"], 10.0),
    ("llama-2-70b, 1024 GPUs, DP max-throughput",
     ["--model", "llama-2-70b", "--gpus", "1024", "--gpus-per-node", "8", "--gpu", "H100-80GB", "--seq-len", "4096",
      "--global-batch", "1024", "--search", "dp", "--objective", "max-throughput"], 3.0),
    ("llama-3-405b, 16384 GPUs, DP max-throughput",
     ["--model", "llama-3-405b", "--gpus", "16384", "--gpus-per-node", "8", "--gpu", "H100-80GB",
      "--global-batch", "16384", "--search", "dp", "--objective", "max-throughput"], 5.0),
    ("gpt-7.5b, 8 GPUs (one node), auto min-memory, batch 64",
     ["--model", "gpt-7.5b", "--gpus", "8", "--gpu", "A100-80GB", "--global-batch", "64", "--search", "auto",
      "--objective", "min-memory"], 10.0),
]


def run(args: list[str]) -> tuple[float, dict]:  # type: ignore[type-arg]
    """Wall seconds and the JSON document (``{"error": ...}`` when the command failed)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    t0 = time.perf_counter()
    out = subprocess.run([PARPLAN, "plan", *args, "--json"], capture_output=True, text=True, check=False, env=env)
    secs = time.perf_counter() - t0
    if out.returncode != 0:
        return secs, {"error": f"exit {out.returncode}: {out.stderr.strip().splitlines()[-1:]}"}
    return secs, json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=1, help="runs per case; the table shows the fastest")
    ap.add_argument("--only", default=None, help="only cases whose label contains this")
    ap.add_argument("--time-limit", default=None, help="passed to parplan plan (default: its own, 60 s)")
    a = ap.parse_args()
    import parplan

    compileall.compile_dir(os.path.dirname(parplan.__file__), quiet=1)
    print(header("Speed of the whole plan command (issue 10)"))
    print("| case | goal s | whole command s | met | search | status | peak GiB | step s | work |")
    print("|---|---:|---:|---|---|---|---:|---:|---|")
    met = 0
    cases = [c for c in CASES if not a.only or a.only in c[0]]
    for label, args, goal in cases:
        extra = ["--time-limit", a.time_limit] if a.time_limit else []
        runs = [run(args + extra) for _ in range(max(a.repeat, 1))]
        secs, doc = min(runs, key=lambda r: r[0])
        if "error" in doc:
            print(f"| {label} | {goal:g} | {secs:.2f} | NO | - | {doc['error']} | - | - | - |")
            continue
        solver = doc.get("solver", {})
        work = json.dumps(solver.get("work", {}), separators=(",", ":"))
        peak = doc["memory"]["peak_bytes"] / 2**30 if doc.get("memory") else float("nan")
        step = doc["time"]["step_seconds"] if doc.get("time") else float("nan")
        ok = secs < goal
        met += ok
        print(f"| {label} | {goal:g} | {secs:.2f} | {'yes' if ok else 'NO'} | {solver.get('method')} | "
              f"{solver.get('status')} | {peak:.2f} | {step:.3f} | `{work}` |")
        sys.stdout.flush()
    print(f"\n{met} of {len(cases)} goals met (fastest of {max(a.repeat, 1)} run(s) per case).")


if __name__ == "__main__":
    main()

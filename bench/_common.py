"""Shared helpers for the benchmarks: a header naming the command, date and machine."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
import time


def commit() -> str:
    """The checked-out commit, marked when the working tree has uncommitted changes."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" (with uncommitted changes)" if dirty else "")


def header(title: str) -> str:
    """Title, the exact command, the date (UTC), the commit and the machine the figures come from."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            models = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        if models:
            cpu = f"{models[0]} x {len(models)}"
    except OSError:
        pass
    cmd = " ".join(["python", *sys.argv])
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load = ""
    if hasattr(os, "getloadavg"):
        load = ", load average before the run " + " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"## {title}\n\ncommand: `{cmd}`  \ndate: {date}  \ncommit: {commit()}  \nmachine: {cpu}, "
            f"{os.cpu_count()} cores, Python {platform.python_version()}{load}, reference loop "
            f"{reference_loop_seconds():.3f} s CPU  \npackages: {packages()}\n")


def reference_loop_seconds() -> float:
    """CPU seconds of an empty 10^7-iteration Python loop, the fastest of three: how fast this host
    runs Python at the moment, so that timings taken on hosts of different speeds (the same
    commands have run about 3x slower in one session than in another) can be told apart."""
    best = float("inf")
    for _ in range(3):
        t = time.process_time()
        for _ in range(10**7):
            pass
        best = min(best, time.process_time() - t)
    return best


def packages() -> str:
    """Versions of the packages the figures depend on (a solver or numpy upgrade moves timings)."""
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for name in ("highspy", "numpy", "torch", "pulp"):
        try:
            out.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            out.append(f"{name} absent")
    return ", ".join(out)

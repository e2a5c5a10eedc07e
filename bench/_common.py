"""Shared helpers for the benchmarks: a header naming the command, date and machine."""

from __future__ import annotations

import datetime
import os
import platform
import sys


def header(title: str) -> str:
    """Title, the exact command, the date (UTC) and the machine the figures come from."""
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
    return (f"## {title}\n\ncommand: `{cmd}`  \ndate: {date}  \nmachine: {cpu}, {os.cpu_count()} cores, "
            f"Python {platform.python_version()}\n")

"""Issue 11: planning for a target, as a user runs it (the whole ``parplan plan --target T``).

Each case runs as a fresh process, timed from outside; the plan, how it compares with the target's
own baseline, and the work done (uniform strategies searched, step times and memories priced) are
printed beside the time so that a figure can be told from noise.
Run: python bench/target_speed.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from _common import header

PARPLAN = os.path.join(os.path.dirname(sys.executable), "parplan")

#: (model, GPUs, GPU, global batch)
SHAPES = [("llama-3-8b", 8, "H100-80GB", 32), ("llama-3-70b", 64, "H100-80GB", 128),
          ("mixtral-8x7b", 64, "H100-80GB", 128), ("llama-2-70b", 1024, "H100-80GB", 1024)]
TARGETS = ["megatron", "torchtitan", "deepspeed", "galvatron"]


def main() -> None:
    print(header("Planning for a target (whole command)"))
    print("| target | model | GPUs | s | plan | peak GiB | step s | vs own baseline: memory, time | searched "
          "| times priced | memories priced |")
    print("|---|---|---:|---:|---|---:|---:|---|---:|---:|---:|")
    for target in TARGETS:
        for model, gpus, gpu, gb in SHAPES:
            args = [PARPLAN, "plan", "--model", model, "--gpus", str(gpus), "--gpus-per-node", "8", "--gpu", gpu,
                    "--global-batch", str(gb), "--target", target, "--json"]
            t0 = time.perf_counter()
            out = subprocess.run(args, capture_output=True, text=True, check=False)
            secs = time.perf_counter() - t0
            if out.returncode not in (0, 3):
                print(f"| {target} | {model} | {gpus} | {secs:.2f} | error: {out.stderr.strip()[-120:]} |||||||")
                continue
            doc = json.loads(out.stdout)
            work = doc["solver"]["work"]
            if doc.get("memory") is None:
                print(f"| {target} | {model} | {gpus} | {secs:.2f} | nothing fits | | | | "
                      f"{doc['solver'].get('candidates', '')} | {work['baseline_evaluations']} | "
                      f"{work['baseline_memory_evaluations']} |")
                continue
            vs = doc["target"]["versus_baseline"]
            rel = f"{vs['memory_ratio']:.2f}x, {vs['time_ratio']:.2f}x" if vs else "-"
            print(f"| {target} | {model} | {gpus} | {secs:.2f} | {doc['strategy']['summary']} | "
                  f"{doc['memory']['peak_bytes'] / 2**30:.2f} | {doc['time']['step_seconds']:.3f} | {rel} | "
                  f"{doc['solver'].get('candidates', '')} | {work['baseline_evaluations']} | "
                  f"{work['baseline_memory_evaluations']} |")


if __name__ == "__main__":
    main()

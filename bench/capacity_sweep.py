"""A capacity sweep's wall time in the Celery layout: the same sweep on 1 and on 2 workers (each on
a fresh database, so every cell is solved), then again with every cell cached.

Starts PostgreSQL databases of its own (scratch, dropped after), a Redis queue of its own, one
``parplan serve`` and the workers; the sweep is ``POST /v1/capacity`` followed to its end.

    python bench/capacity_sweep.py --output bench/out/capacity_sweep.txt
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._common import header
from parplan.solver.capacity import gpu_counts
from tests.support.service import (
    REDIS_URL,
    Proc,
    create_database,
    drop_database,
    finished,
    poll_job,
    service_env,
    start_server,
    start_worker,
)


def sweep_body(args: argparse.Namespace) -> dict[str, Any]:
    pools = [{"gpu": gpu, "gpus_per_node": 8, "max_gpus": args.max_gpus, "price_per_gpu_hour": price}
             for gpu, price in (("H100-80GB", 2.5), ("A100-80GB", 1.4))]
    return {"model": {"preset": args.model}, "pools": pools, "search": "dp",
            "training": {"global_batch": args.global_batch, "seq_len": args.seq_len, "tokens": 1e12}}


def _token(env: dict[str, str]) -> str:
    out = subprocess.run([sys.executable, "-m", "parplan.cli", "token", "create", "--scope", "plans:write",
                          "--name", "bench"], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def timed_sweep(base: str, token: str, body: dict[str, Any], timeout: float) -> tuple[float, dict[str, Any]]:
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=60) as c:
        t0 = time.monotonic()
        r = c.post("/v1/capacity", json=body)
        r.raise_for_status()
        job = poll_job(c, r.json()["job"]["url"], finished, timeout=timeout, interval=0.2)
        seconds = time.monotonic() - t0
        if job["status"] != "succeeded":
            raise SystemExit(f"the sweep ended {job['status']}: {job}")
        doc: dict[str, Any] = c.get(r.json()["result_url"]).json()
    return seconds, doc


def run(workers: int, body: dict[str, Any], cached_too: bool, timeout: float) -> list[tuple[str, float, str]]:
    dbname = f"parplan_bench_cap_{os.getpid()}_{workers}"
    env = service_env({"PARPLAN_AUTH": "required", "PARPLAN_DATABASE_URL": create_database(dbname),
                       "PARPLAN_BROKER_URL": REDIS_URL, "PARPLAN_QUEUE_NAME": f"parplan-bench-{uuid.uuid4().hex[:6]}",
                       "PARPLAN_MAX_DEVICES": "4096", "PARPLAN_SOLVER_NICE": "0"})
    procs: list[Proc] = []
    rows = []
    try:
        token = _token(env)
        server, base = start_server(env)
        procs.append(server)
        procs += [start_worker(env) for _ in range(workers)]
        seconds, doc = timed_sweep(base, token, body, timeout)
        fits = sum(1 for c in doc["cells"] if c["fits"])
        rows.append((f"{workers} worker(s), every cell solved", seconds,
                     f"{len(doc['cells'])} cells, {fits} fit; fewest that fit: {doc['fewest_gpus_that_fit']}"))
        if cached_too:
            seconds, doc = timed_sweep(base, token, body, timeout)
            rows.append((f"{workers} worker(s), every cell cached", seconds, f"{len(doc['cells'])} cells"))
    finally:
        for p in procs:
            p.stop()
        drop_database(dbname)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="bert-large", help="model preset (default bert-large)")
    p.add_argument("--max-gpus", type=int, default=776,
                   help="each of the two pools' maximum (default 776: 3 sub-node counts + 97 nodes = 100 cells)")
    p.add_argument("--global-batch", type=int, default=1024)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--timeout", type=float, default=3600.0, help="give up on a sweep after this many seconds")
    p.add_argument("--note", default="", help="a line about the machine's state, written into the record")
    p.add_argument("--output", type=Path, help="also write the report here (bench/out/capacity_sweep.txt)")
    args = p.parse_args(argv)
    body = sweep_body(args)
    cells = 2 * len(gpu_counts(8, args.max_gpus))
    rows = run(1, body, True, args.timeout) + run(2, body, False, args.timeout)
    lines = [header("capacity sweep wall time (bench/capacity_sweep.py)"),
             f"sweep: {args.model}, global batch {args.global_batch}, seq {args.seq_len}, DP search, two pools "
             f"(H100-80GB, A100-80GB; 8 per node, up to {args.max_gpus} GPUs each): {cells} cells  ",
             "layout: parplan serve + Celery workers (concurrency 1 each), PostgreSQL and Redis on this machine  "]
    if args.note:
        lines.append(f"note: {args.note}  ")
    lines += ["", "| run | wall seconds | result |", "|---|---:|---|"]
    lines += [f"| {name} | {seconds:.1f} | {what} |" for name, seconds, what in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.output:
        args.output.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

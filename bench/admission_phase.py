"""The admission phase of a burst alone (issue 15): how fast the API admits new jobs, and what a
job-status poll and a cached plan answer at meanwhile.

Starts ``parplan serve`` on a scratch PostgreSQL database with Redis (the production layout's API),
runs one warm-up job on a Celery worker, stops the worker (so nothing else competes for the CPU and
the jobs just wait), then submits ``--jobs`` distinct plan requests from 10 tokens, 16 at a time
(``service_burst.py``'s requests and submitter), while probing ``GET /v1/jobs/{id}`` and a cached
``POST /v1/plans`` at ``--probe-rate`` each per second, open loop. ``--prober same`` runs the probes
in the submitting process's event loop, as ``service_burst.py`` does; ``--prober own`` in a
process of their own, as a dashboard would be (their window is then ``--window`` seconds from the
start of the submissions).

    .venv/bin/python bench/admission_phase.py --prober own
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from typing import Any

import httpx
from service_burst import OwnProber, make_token, pct, probe, submit_all  # also puts the repository root on sys.path

from tests.support.service import (
    FAST_REQUEST,
    REDIS_URL,
    create_database,
    drop_database,
    service_env,
    start_server,
    start_worker,
)


async def _same_process(base: str, tokens: list[str], per_token: int, job: str,
                        rate: float) -> tuple[float, dict[str, list[float]]]:
    stop = asyncio.Event()
    task = asyncio.create_task(probe(base, tokens[0], job, rate, stop))
    t0 = time.perf_counter()
    await submit_all(base, tokens, per_token)
    took = time.perf_counter() - t0
    stop.set()
    return took, await task


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=500)
    p.add_argument("--prober", choices=("same", "own"), default="own")
    p.add_argument("--probe-rate", type=float, default=20.0)
    p.add_argument("--window", type=float, default=12.0, help="seconds the own-process prober runs")
    args = p.parse_args(argv)
    name = f"parplan_admission_{os.getpid()}"
    env = service_env({"PARPLAN_DATABASE_URL": create_database(name), "PARPLAN_BROKER_URL": REDIS_URL,
                       "PARPLAN_QUEUE_NAME": f"parplan-admission-{os.getpid()}", "PARPLAN_AUTH": "required"})
    procs = []
    try:
        tokens = [make_token(env, f"admission-{k}") for k in range(10)]
        server, base = start_server(env)
        procs.append(server)
        worker = start_worker(env)
        procs.append(worker)
        with httpx.Client(base_url=base, timeout=120, headers={"Authorization": f"Bearer {tokens[0]}"}) as c:
            job = c.post("/v1/plans", json=FAST_REQUEST).json()["job"]
            while job["status"] not in ("succeeded", "failed"):
                time.sleep(0.2)
                job = c.get(f"/v1/jobs/{job['id']}").json()["job"]
            if c.post("/v1/plans", json=FAST_REQUEST).status_code != 200:
                raise SystemExit("the warm-up request was not cached")
        worker.stop()
        time.sleep(1.0)
        if args.prober == "same":
            took, lat = asyncio.run(_same_process(base, tokens, args.jobs // 10, job["id"], args.probe_rate))
        else:
            prober = OwnProber(base, tokens[0], job["id"], args.probe_rate)
            time.sleep(0.5)
            t0 = time.perf_counter()
            asyncio.run(submit_all(base, tokens, args.jobs // 10))
            took = time.perf_counter() - t0
            time.sleep(max(0.0, args.window - took))
            lat = prober.finish()
        out: dict[str, Any] = {"jobs": args.jobs, "prober": args.prober, "submitted in s": round(took, 2)}
        for kind in ("cached POST /v1/plans", "GET /v1/jobs/{id}"):
            xs = lat[kind]
            out[kind] = {"n": len(xs), "p50 ms": round(pct(xs, 50), 1), "p99 ms": round(pct(xs, 99), 1),
                         "max ms": round(max(xs), 1)}
        print(json.dumps(out))
    finally:
        for proc in procs:
            proc.stop()
        drop_database(name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

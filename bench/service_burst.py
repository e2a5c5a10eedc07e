"""A burst of distinct plan requests from several tokens against the production layout (issue 15).

Starts its own service on 127.0.0.1 — ``parplan serve`` on a scratch PostgreSQL database, Redis,
and ``--workers`` Celery workers — makes ``--tokens`` tokens, then submits ``--jobs`` distinct
plan requests (small ones: bert-large on 2 GPUs, the DP search, each a different sequence length
and global batch, so none is answered from the cache) as fast as it can, token after token: the
first token's requests are all queued before the second's, which is the case where fairness
matters. While the jobs run it measures, open loop, a cached ``POST /v1/plans`` and a
``GET /v1/jobs/{id}`` at ``--probe-rate`` each per second, from a process of its own (``--prober
own``, the default: a dashboard is another client) or from the submitting process's event loop
(``--prober same``, how the figures before 2026-11-24 22:00 UTC were taken; that loop is busy
sending the burst, which adds its own delay to the probes). Then it waits for every job to end and
reports:

* every job ended (succeeded, or failed with a reason); none lost (every submitted id is found,
  finished); none run twice (``attempts`` is 1);
* per token: when its first and its last job finished (the jobs' ``finished_at``), and the median
  finish, from the start of the burst (a fair scheduler gives every token the same medians; first
  come, first served gives the first token its jobs first);
* the probes' p50 / p99 during the burst (the target: p99 under 50 ms).

    .venv/bin/python bench/service_burst.py                       # 1,000 jobs, 10 tokens, 2 workers
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

import httpx
from service_load import git_commit, machine  # also puts the repository root on sys.path

from tests.support.service import (
    FAST_REQUEST,
    REDIS_URL,
    Proc,
    create_database,
    drop_database,
    service_env,
    start_server,
    start_worker,
)

#: bert-large's longest sequence; the requests use lengths from 64 up to it
MAX_SEQ = 512


def request(i: int) -> dict[str, Any]:
    """The ``i``-th distinct request: a sequence length and a global batch of its own."""
    seq = 64 + i % (MAX_SEQ - 63)
    batch = (2, 4, 8)[i // (MAX_SEQ - 63) % 3]
    return {"model": {"preset": "bert-large"}, "cluster": {"gpus": 2, "gpu": "A100-80GB"},
            "training": {"global_batch": batch, "seq_len": seq}, "search": "dp"}


def make_token(env: dict[str, str], name: str) -> str:
    out = subprocess.run([sys.executable, "-m", "parplan.cli", "token", "create", "--scope", "plans:write",
                          "--name", name], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, round(q / 100 * (len(s) - 1)))]


async def submit_all(base: str, tokens: list[str], per_token: int) -> list[tuple[int, str, float]]:
    """(token index, job id, seconds from the start) of every accepted submission, in order."""
    out: list[tuple[int, str, float]] = []
    t0 = time.perf_counter()
    async with httpx.AsyncClient(base_url=base, timeout=60) as c:
        for k, tok in enumerate(tokens):
            sem = asyncio.Semaphore(16)

            async def one(i: int, tok: str = tok, k: int = k, sem: asyncio.Semaphore = sem) -> None:
                async with sem:
                    for _ in range(50):  # 429/503: wait as Retry-After says
                        r = await c.post("/v1/plans", json=request(i),
                                         headers={"Authorization": f"Bearer {tok}"})
                        if r.status_code in (429, 503):
                            await asyncio.sleep(float(r.headers.get("retry-after", "1")))
                            continue
                        r.raise_for_status()
                        out.append((k, r.json()["job"]["id"], time.perf_counter() - t0))
                        return
                    raise SystemExit(f"request {i} refused 50 times")

            await asyncio.gather(*(one(k * per_token + j) for j in range(per_token)))
    return out


async def probe(base: str, token: str, job_id: str, rate: float, stop: asyncio.Event) -> dict[str, list[float]]:
    """Open-loop latencies (ms, from each request's scheduled time) of a cached plan and a job status."""
    lat: dict[str, list[float]] = {"cached POST /v1/plans": [], "GET /v1/jobs/{id}": []}
    due_at: dict[str, list[float]] = {kind: [] for kind in lat}  # each latency's scheduled time (perf_counter)
    errors = 0
    async with httpx.AsyncClient(base_url=base, timeout=30, headers={"Authorization": f"Bearer {token}"}) as c:
        start = time.perf_counter()
        n = 0
        tasks: list[asyncio.Task[None]] = []

        async def send(kind: str, due: float) -> None:
            nonlocal errors
            r = await (c.post("/v1/plans", json=FAST_REQUEST) if kind.startswith("cached")
                       else c.get(f"/v1/jobs/{job_id}"))
            if r.status_code != 200:
                errors += 1
            lat[kind].append((time.perf_counter() - due) * 1000)
            due_at[kind].append(due)

        while not stop.is_set():
            due = start + n / rate
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            for kind in lat:
                tasks.append(asyncio.create_task(send(kind, due)))
            n += 1
        await asyncio.gather(*tasks)
    lat["errors"] = [float(errors)]
    for kind in list(due_at):
        lat[f"due {kind}"] = due_at[kind]
    return lat


def probe_process(base: str, token: str, job_id: str, rate: float, stop: Any, out: Any) -> None:
    """:func:`probe` in a process of its own (``--prober own``) until ``stop`` (a multiprocessing
    event) is set; its latencies go to ``out`` (a multiprocessing queue). The due times are
    ``time.perf_counter()`` readings, one clock for every process of the machine on Linux."""
    async def go() -> dict[str, list[float]]:
        done = asyncio.Event()
        task = asyncio.create_task(probe(base, token, job_id, rate, done))
        while not stop.is_set():
            await asyncio.sleep(0.05)
        done.set()
        return await task
    out.put(asyncio.run(go()))


class OwnProber:
    """The probes in a process of their own (spawned), as a dashboard polling the service would be."""

    def __init__(self, base: str, token: str, job_id: str, rate: float) -> None:
        ctx = mp.get_context("spawn")
        self._stop, self._out = ctx.Event(), ctx.Queue()
        self._proc = ctx.Process(target=probe_process, args=(base, token, job_id, rate, self._stop, self._out))
        self._proc.start()

    def finish(self) -> dict[str, list[float]]:
        self._stop.set()
        lat: dict[str, list[float]] = self._out.get(timeout=120)
        self._proc.join(timeout=30)
        return lat


async def run(base: str, tokens: list[str], per_token: int, warm_job: str, rate: float, timeout: float,
              prober_kind: str = "own") -> tuple[list[tuple[int, str, float]], dict[str, dict[str, Any]],
                                                  dict[str, list[float]]]:
    stop = asyncio.Event()
    if prober_kind == "own":
        own = OwnProber(base, tokens[0], warm_job, rate)
        await asyncio.sleep(1.0)  # the spawned process imports and starts probing
    else:
        prober = asyncio.create_task(probe(base, tokens[0], warm_job, rate, stop))
    t0 = time.perf_counter()
    t0_wall = dt.datetime.now(dt.UTC)
    submitted = await submit_all(base, tokens, per_token)
    submitted_by = time.perf_counter()
    jobs: dict[str, dict[str, Any]] = {}
    finish: dict[str, float] = {}
    async with httpx.AsyncClient(base_url=base, timeout=60, headers={"Authorization": f"Bearer {tokens[0]}"}) as c:
        pending = {jid for _, jid, _ in submitted}
        while pending and time.perf_counter() - t0 < timeout:
            for jid in list(pending):
                r = await c.get(f"/v1/jobs/{jid}")
                r.raise_for_status()
                job = r.json()["job"]
                if job["status"] in ("succeeded", "failed", "cancelled"):
                    jobs[jid] = job
                    finish[jid] = time.perf_counter() - t0
                    pending.discard(jid)
            await asyncio.sleep(0.5)
    stop.set()
    lat = own.finish() if prober_kind == "own" else await prober
    lat["submitted by"] = [submitted_by]
    for jid, job in jobs.items():
        # The server's finish time (same machine, same clock): polling a thousand jobs one by one
        # takes many seconds a round, so the time a poll saw the end would blur the order.
        at = dt.datetime.fromisoformat(job["finished_at"])
        at = at if at.tzinfo else at.replace(tzinfo=dt.UTC)
        job["_finished_after"] = (at - t0_wall).total_seconds()
        job["_seen_after"] = finish[jid]
    return submitted, jobs, lat


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--tokens", type=int, default=10)
    p.add_argument("--workers", type=int, default=2, help="Celery workers (one process each)")
    p.add_argument("--probe-rate", type=float, default=20.0, help="probe requests per second, each kind")
    p.add_argument("--prober", choices=("own", "same"), default="own",
                   help="probe from a process of its own (a dashboard's view), or from the submitting "
                        "process's event loop (the figures recorded before 2026-11-24 22:00 UTC)")
    p.add_argument("--timeout", type=float, default=1800.0, help="give up waiting for the jobs after this")
    p.add_argument("--dispatch-window", type=int, default=None,
                   help="PARPLAN_DISPATCH_WINDOW of the service (default: the service's; 0: first come, first served)")
    args = p.parse_args(argv)
    if args.jobs % args.tokens or args.jobs > 3 * (MAX_SEQ - 63):
        p.error(f"--jobs must be a multiple of --tokens and at most {3 * (MAX_SEQ - 63)} (distinct requests)")
    per_token = args.jobs // args.tokens
    dbname = f"parplan_burst_{os.getpid()}"
    procs: list[Proc] = []
    started = dt.datetime.now(dt.UTC)
    host = machine()  # with the load average before the run
    try:
        env = service_env({"PARPLAN_DATABASE_URL": create_database(dbname), "PARPLAN_BROKER_URL": REDIS_URL,
                           "PARPLAN_QUEUE_NAME": f"parplan-burst-{uuid.uuid4().hex[:6]}", "PARPLAN_AUTH": "required"}
                          | ({"PARPLAN_DISPATCH_WINDOW": str(args.dispatch_window)}
                             if args.dispatch_window is not None else {}))
        tokens = [make_token(env, f"burst-{k}") for k in range(args.tokens)]
        server, base = start_server(env)
        procs.append(server)
        procs += [start_worker(env) for _ in range(args.workers)]
        with httpx.Client(base_url=base, timeout=120, headers={"Authorization": f"Bearer {tokens[0]}"}) as c:
            r = c.post("/v1/plans", json=FAST_REQUEST)
            r.raise_for_status()
            warm = r.json()["job"]
            deadline = time.monotonic() + 300
            while warm["status"] not in ("succeeded", "failed") and time.monotonic() < deadline:
                time.sleep(0.2)
                warm = c.get(f"/v1/jobs/{warm['id']}").json()["job"]
            if c.post("/v1/plans", json=FAST_REQUEST).status_code != 200:
                raise SystemExit("the warm-up plan is not served from the cache")
        t0 = time.perf_counter()
        submitted, jobs, lat = asyncio.run(run(base, tokens, per_token, warm["id"], args.probe_rate, args.timeout,
                                               args.prober))
        wall = time.perf_counter() - t0
    finally:
        for proc in procs:
            proc.stop()
        drop_database(dbname)

    ids = [jid for _, jid, _ in submitted]
    lost = [jid for jid in ids if jid not in jobs]
    by_status: dict[str, int] = {}
    for job in jobs.values():
        by_status[job["status"]] = by_status.get(job["status"], 0) + 1
    failed_without_reason = [jid for jid, j in jobs.items() if j["status"] == "failed" and not j.get("error")]
    twice = [jid for jid, j in jobs.items() if int(j.get("attempts") or 0) != 1]
    print("## A burst of distinct plan requests (issue 15)\n")
    given = " ".join(argv if argv is not None else sys.argv[1:])
    print(f"command: `python service_burst.py{' ' + given if given else ''}`  ")
    print(f"date: {started.strftime('%Y-%m-%d %H:%M UTC')}  ")
    print(f"commit: {git_commit()}  ")
    print(f"machine: {host}  ")
    print(f"service: parplan serve (one API process) on a scratch PostgreSQL database, Redis, {args.workers} "
          f"Celery worker(s); {args.tokens} tokens x {per_token} distinct requests (bert-large, 2 GPUs, DP), "
          "submitted token after token; probes from "
          f"{'a process of their own' if args.prober == 'own' else 'the submitting process'}\n")
    print(f"- submitted {len(ids)} (distinct ids: {len(set(ids))}); finished {len(jobs)} in {wall:.1f} s; "
          f"by status: {by_status}")
    print(f"- lost (never finished): {len(lost)}; failed without a reason: {len(failed_without_reason)}; "
          f"attempts other than 1: {len(twice)}")
    busy = sum((dt.datetime.fromisoformat(j["finished_at"]) - dt.datetime.fromisoformat(j["started_at"]))
               .total_seconds() for j in jobs.values() if j.get("started_at") and j.get("finished_at"))
    print(f"- workers busy (sum of the jobs' started-to-finished times over {args.workers} x the wall time): "
          f"{busy / (args.workers * wall):.0%}")
    print("\n| token | submitted by s | first finished s | median finished s | last finished s |")
    print("|---:|---:|---:|---:|---:|")
    for k in range(args.tokens):
        mine = [jid for t, jid, _ in submitted if t == k]
        sub = max(s for t, _, s in submitted if t == k)
        fin = sorted(jobs[j]["_finished_after"] for j in mine if j in jobs)
        print(f"| {k} | {sub:.1f} | {fin[0]:.1f} | {statistics.median(fin):.1f} | {fin[-1]:.1f} |")
    print("\n| probe during the burst | requests | p50 ms | p99 ms | max ms |")
    print("|---|---:|---:|---:|---:|")
    kinds = [k for k in lat if k not in ("errors", "submitted by") and not k.startswith("due ")]
    for kind in kinds:
        xs = lat[kind]
        print(f"| {kind} | {len(xs)} | {pct(xs, 50):.1f} | {pct(xs, 99):.1f} | {max(xs):.1f} |")
    # The same probes split at the end of the submissions (the API admits the burst, then only serves).
    for kind in kinds:
        during = [x for x, due in zip(lat[kind], lat[f"due {kind}"], strict=True) if due < lat["submitted by"][0]]
        after = [x for x, due in zip(lat[kind], lat[f"due {kind}"], strict=True) if due >= lat["submitted by"][0]]
        print(f"| {kind}, while the burst was submitted | {len(during)} | {pct(during, 50):.1f} | "
              f"{pct(during, 99):.1f} | {max(during, default=float('nan')):.1f} |")
        print(f"| {kind}, after | {len(after)} | {pct(after, 50):.1f} | {pct(after, 99):.1f} | "
              f"{max(after, default=float('nan')):.1f} |")
    print(f"\nprobe errors (non-200): {int(lat['errors'][0])}")
    return 0 if not lost and not failed_without_reason and not twice else 1


if __name__ == "__main__":
    sys.exit(main())

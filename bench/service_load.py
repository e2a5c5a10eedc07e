"""Load test of the planning service on loopback: requests per second and latency percentiles of
the two hot read paths — a *cached* ``POST /v1/plans`` (validate, hash, look up, return the plan)
and ``GET /v1/jobs/{id}`` — and of the dashboard's pages and static files.

By default it starts its own service (``parplan serve``, plus a Celery worker in production mode)
on 127.0.0.1, solves one small plan so the cache holds it, then for each endpoint runs

* an **open-loop** phase: requests sent on a fixed schedule (``--rate`` per second for
  ``--duration`` seconds) whatever the answers do; latency is measured from each request's
  *scheduled* time, so a stalled server cannot hide queueing (no coordinated omission);
* a **closed-loop** phase: ``--concurrency`` clients back to back, for the saturation throughput.

The **dashboard** phase requests each page (``/ui``, ``/ui/new``, ``/ui/jobs/{id}``,
``/ui/plans/{id}``, ``/ui/validations/{id}``, with the ids of a real job, plan and validation) and
each static file the pages load, one URL after another, open loop at ``--dashboard-rate`` (50) per
second for ``--dashboard-duration`` seconds each; the target is p99 < 100 ms.

Bounded: at most rate x duration requests per open-loop phase, a fixed duration per closed-loop
phase; only 127.0.0.1 is ever contacted.

    .venv/bin/python bench/service_load.py                         # embedded default (SQLite)
    .venv/bin/python bench/service_load.py --mode production       # PostgreSQL + Redis + Celery
    .venv/bin/python bench/service_load.py --url http://127.0.0.1:8000 --token ppt_...   # a running one
    .venv/bin/python bench/service_load.py --phases dashboard     # only the dashboard's pages
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from sqlalchemy.engine import make_url

# The live-service helpers are the tests' support code (tests/support/service.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.support.service import (
    FAST_REQUEST,
    POSTGRES_ADMIN_URL,
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

ROOT = Path(__file__).resolve().parents[1]
MAX_REQUESTS = 20_000  # hard bound on any one phase
ERRORS: dict[str, int] = {}  # failed requests by status code or exception
#: The dashboard's static files (what its pages load).
UI_STATIC = ("ui.css", "ui.js", "jobs.js", "new.js", "job.js", "plan.js", "validation.js", "charts.js", "capacity.js",
             "vendor/uplot/uPlot.iife.min.js", "vendor/uplot/uPlot.min.css")


@dataclass
class Result:
    name: str
    phase: str
    sent: int
    ok: int
    errors: int
    seconds: float
    latencies_ms: list[float]
    client_cpu: float = 0.0
    server_cpu: float | None = None
    group: str = "api"  # or "dashboard"

    @property
    def rps(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0

    def pct(self, q: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        xs = sorted(self.latencies_ms)
        return xs[min(len(xs) - 1, round(q / 100 * (len(xs) - 1)))]

    def row(self) -> str:
        server = f"{self.server_cpu:>7.0%}" if self.server_cpu is not None else f"{'?':>7s}"
        return (f"{self.name:<30s} {self.phase:<18s} {self.sent:>6d} {self.errors:>5d} {self.rps:>8.1f} "
                f"{self.pct(50):>8.2f} {self.pct(90):>8.2f} {self.pct(99):>8.2f} {max(self.latencies_ms or [0]):>8.2f}"
                f" {server} {self.client_cpu:>7.0%}")


HEADER = (f"{'endpoint':<30s} {'phase':<18s} {'sent':>6s} {'errs':>5s} {'req/s':>8s} "
          f"{'p50 ms':>8s} {'p90 ms':>8s} {'p99 ms':>8s} {'max ms':>8s} {'srv cpu':>7s} {'cli cpu':>7s}")


class RawClient:
    """A minimal HTTP/1.1 keep-alive client over asyncio streams (loopback only). It costs a small
    fraction of what httpx costs per request, so the client steals less CPU from the server
    it measures on the same machine."""

    def __init__(self, base: str, headers: dict[str, str], max_connections: int = 64) -> None:
        parts = urlsplit(base)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.headers = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.open = 0
        self.max_connections = max_connections
        self.slot = asyncio.Semaphore(max_connections)

    def encode(self, method: str, path: str, body: Any) -> bytes:
        data = b"" if body is None else json.dumps(body).encode()
        head = (f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n{self.headers}"
                f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n")
        return head.encode() + data

    async def request(self, raw: bytes) -> int:
        async with self.slot:
            reused = bool(self.idle)
            while True:
                if self.idle and reused:
                    reader, writer = self.idle.pop()
                else:
                    reader, writer = await asyncio.open_connection(self.host, self.port)
                    self.open += 1
                try:
                    writer.write(raw)
                    head = await reader.readuntil(b"\r\n\r\n")
                except (OSError, asyncio.IncompleteReadError):
                    writer.close()
                    self.open -= 1
                    if reused:  # the server closed an idle keep-alive connection: retry on a new one
                        reused = False
                        continue
                    raise
                break
            try:
                status = int(head.split(b" ", 2)[1])
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                await reader.readexactly(length)
            except BaseException:
                writer.close()
                self.open -= 1
                raise
            self.idle.append((reader, writer))
            return status

    async def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()


async def attempt(client: RawClient, raw: bytes) -> bool:
    """Send one request; True on a 200, else count the failure (status code or error type) in ERRORS."""
    try:
        code = await client.request(raw)
        ok, status = code == 200, str(code)
    except (OSError, asyncio.IncompleteReadError, ValueError) as e:
        ok, status = False, type(e).__name__
    if not ok:
        ERRORS[status] = ERRORS.get(status, 0) + 1
    return ok


async def open_loop(client: RawClient, name: str, raw: bytes, rate: float, duration: float) -> Result:
    n = min(int(rate * duration), MAX_REQUESTS)
    lat: list[float] = []
    errors = 0
    loop = asyncio.get_running_loop()
    t0 = loop.time() + 0.05

    async def one(i: int) -> None:
        nonlocal errors
        scheduled = t0 + i / rate
        delay = scheduled - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        if await attempt(client, raw):
            lat.append((loop.time() - scheduled) * 1000)
        else:
            errors += 1

    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return Result(name, f"open loop @ {rate:g}/s", n, len(lat), errors, time.perf_counter() - start, lat)


async def closed_loop(client: RawClient, name: str, raw: bytes, concurrency: int, duration: float) -> Result:
    lat: list[float] = []
    errors = 0
    sent = 0
    stop = time.perf_counter() + duration

    async def worker() -> None:
        nonlocal errors, sent
        while time.perf_counter() < stop and sent < MAX_REQUESTS:
            sent += 1
            t = time.perf_counter()
            if await attempt(client, raw):
                lat.append((time.perf_counter() - t) * 1000)
            else:
                errors += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return Result(name, f"closed loop x{concurrency}", sent, len(lat), errors, time.perf_counter() - start, lat)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def dashboard_targets(client: RawClient, ids: dict[str, str]) -> list[tuple[str, bytes]]:
    """The dashboard's pages (with real ids) and static files, as requests."""
    pages = ["/ui", "/ui/new", f"/ui/jobs/{ids['job']}", f"/ui/plans/{ids['plan']}",
             f"/ui/validations/{ids['validation']}"]
    names = ["GET /ui", "GET /ui/new", "GET /ui/jobs/{id}", "GET /ui/plans/{id}", "GET /ui/validations/{id}"]
    out = [(name, client.encode("GET", path, None)) for name, path in zip(names, pages, strict=True)]
    return out + [(f"GET /ui/static/{f}", client.encode("GET", f"/ui/static/{f}", None)) for f in UI_STATIC]


async def measure(base: str, token: str | None, ids: dict[str, str], args: argparse.Namespace,
                  server_pid: int | None) -> list[Result]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    client = RawClient(base, headers)
    out: list[Result] = []

    async def timed(run: Any, group: str) -> None:
        c0, s0 = time.process_time(), _cpu_seconds(server_pid) if server_pid else 0.0
        r: Result = await run
        r.client_cpu = (time.process_time() - c0) / r.seconds
        r.server_cpu = ((_cpu_seconds(server_pid) - s0) / r.seconds) if server_pid else None
        r.group = group
        out.append(r)

    try:
        if "api" in args.phases:
            targets = [("POST /v1/plans (cached)", client.encode("POST", "/v1/plans", FAST_REQUEST)),
                       ("GET /v1/jobs/{id}", client.encode("GET", f"/v1/jobs/{ids['job']}", None))]
            for name, raw in targets:
                await closed_loop(client, name, raw, 4, 2.0)  # warm-up, discarded
                await timed(open_loop(client, name, raw, args.rate, args.duration), "api")
                await timed(closed_loop(client, name, raw, args.concurrency, args.duration), "api")
        if "dashboard" in args.phases:
            for name, raw in dashboard_targets(client, ids):
                await closed_loop(client, name, raw, 2, 0.5)  # warm-up, discarded
                await timed(open_loop(client, name, raw, args.dashboard_rate, args.dashboard_duration), "dashboard")
    finally:
        await client.close()
    return out


def machine() -> str:
    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 2**20:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    load = ""
    if hasattr(os, "getloadavg"):
        load = ", load average before the run " + " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"{platform.node()}: {platform.system()} {platform.release()}, {os.cpu_count()} CPU ({cpu}){mem}, "
            f"Python {platform.python_version()}{load}")


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=5)
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain"], capture_output=True, text=True,
                               timeout=5).stdout.strip()
        return out.stdout.strip() + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "?"


def _token(env: dict[str, str]) -> str:
    out = subprocess.run([sys.executable, "-m", "parplan.cli", "token", "create", "--scope", "plans:write",
                          "--name", "bench"], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--url", help="a running service on loopback (default: start one)")
    p.add_argument("--token", help="bearer token (plans:write) for --url")
    p.add_argument("--mode", choices=["embedded", "production"], default="embedded",
                   help="service layout to start: embedded (SQLite, in-process executor) or production "
                        "(PostgreSQL + Redis + a Celery worker)")
    p.add_argument("--rate", type=float, default=200.0, help="open-loop requests per second (default 200)")
    p.add_argument("--duration", type=float, default=15.0, help="seconds per phase (default 15)")
    p.add_argument("--concurrency", type=int, default=8, help="closed-loop clients (default 8)")
    p.add_argument("--api-workers", type=int, default=1, help="API processes to start (default 1)")
    p.add_argument("--phases", type=lambda v: set(v.split(",")), default={"api", "dashboard"},
                   help="comma-separated: api (cached POST /v1/plans, GET /v1/jobs/{id}), dashboard (default both)")
    p.add_argument("--dashboard-rate", type=float, default=50.0, help="dashboard requests per second (default 50)")
    p.add_argument("--dashboard-duration", type=float, default=10.0,
                   help="seconds per dashboard URL (default 10)")
    p.add_argument("--output", type=Path, help="also write the report here (e.g. bench/out/service_load.txt)")
    args = p.parse_args(argv)
    if args.rate <= 0 or args.duration <= 0 or args.rate * args.duration > MAX_REQUESTS:
        p.error(f"rate x duration must be in (0, {MAX_REQUESTS}]")
    if not args.phases or not args.phases <= {"api", "dashboard"}:
        p.error("--phases: api, dashboard or both")
    if args.dashboard_rate <= 0 or args.dashboard_duration <= 0 or \
            args.dashboard_rate * args.dashboard_duration > MAX_REQUESTS:
        p.error(f"dashboard rate x duration must be in (0, {MAX_REQUESTS}]")

    procs: list[Proc] = []
    dbname = None
    tmp = tempfile.TemporaryDirectory(prefix="parplan-bench-")
    try:
        if args.url:
            host = urlsplit(args.url).hostname
            if host not in ("127.0.0.1", "localhost", "::1"):
                p.error("--url must be a loopback address")
            base, token = args.url.rstrip("/"), args.token
        else:
            settings: dict[str, str] = {"PARPLAN_AUTH": "required"}
            if args.mode == "embedded":
                settings["PARPLAN_DATA_DIR"] = tmp.name
            else:
                dbname = f"parplan_bench_{os.getpid()}"
                settings.update({"PARPLAN_DATABASE_URL": create_database(dbname), "PARPLAN_BROKER_URL": REDIS_URL,
                                 "PARPLAN_QUEUE_NAME": f"parplan-bench-{uuid.uuid4().hex[:6]}"})
            env = service_env(settings)
            token = _token(env)
            extra = ["--workers", str(args.api_workers)] if args.api_workers > 1 else []
            server, base = start_server(env, *extra)
            procs.append(server)
            if args.mode == "production":
                procs.append(start_worker(env))
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        with httpx.Client(base_url=base, headers=headers, timeout=30) as c:
            r = c.post("/v1/plans", json=FAST_REQUEST)
            r.raise_for_status()
            job = r.json()["job"]
            if r.status_code == 202:
                job = poll_job(c, r.headers["location"], finished, timeout=300)
            if job["status"] != "succeeded":
                raise SystemExit(f"the warm-up plan failed: {job}")
            if c.post("/v1/plans", json=FAST_REQUEST).status_code != 200:
                raise SystemExit("the warm-up plan is not served from the cache")
            validation = c.post(f"/v1/plans/{job['plan_id']}/validations", json={})
            validation.raise_for_status()
            ids = {"job": job["id"], "plan": job["plan_id"], "validation": validation.json()["validation"]["id"]}
        started = dt.datetime.now(dt.UTC)
        host_line = machine()
        server_pid = procs[0].pid if procs else None
        results = asyncio.run(measure(base, token, ids, args, server_pid))
    finally:
        for proc in procs:
            proc.stop()
        if dbname:
            drop_database(dbname)
        tmp.cleanup()

    api_open = [r for r in results if r.group == "api" and r.phase.startswith("open")]
    ui = [r for r in results if r.group == "dashboard"]
    target_ok = all(r.pct(99) < 50 and r.errors == 0 and r.rps >= 0.95 * args.rate for r in api_open)
    ui_ok = all(r.pct(99) < 100 and r.errors == 0 and r.rps >= 0.95 * args.dashboard_rate for r in ui)
    targets = []
    if api_open:
        targets += [f"target: p99 < 50 ms at {args.rate:g} req/s, no errors (open loop): "
                    f"{'MET' if target_ok else 'NOT MET'}",
                    f"p99 means: {statistics.fmean(r.pct(99) for r in api_open):.2f} ms (open loop)"]
    if ui:
        targets += [f"dashboard target: p99 < 100 ms at {args.dashboard_rate:g} req/s per URL, no errors: "
                    f"{'MET' if ui_ok else 'NOT MET'} (worst p99 {max(r.pct(99) for r in ui):.2f} ms, "
                    f"{max(ui, key=lambda r: r.pct(99)).name})"]
    if args.url:
        layout = "an existing service at " + base
    else:
        pg = make_url(POSTGRES_ADMIN_URL)
        stores = ("SQLite file, in-process executor" if args.mode == "embedded" else
                  f"PostgreSQL {pg.host}:{pg.port or 5432} (a scratch database), Redis, one Celery worker")
        layout = (f"parplan serve ({args.mode}: {stores}), {args.api_workers} API process(es), "
                  "auth required (bearer token)")
    report = "\n".join([
        "parplan service load test (bench/service_load.py)",
        f"command:  {shlex.join([Path(sys.executable).name, *sys.argv])}",
        f"date:     {started.strftime('%Y-%m-%d %H:%M:%S UTC')}",
        f"machine:  {host_line}",
        f"commit:   {git_commit()}",
        f"service:  {layout}",
        "client:   asyncio HTTP/1.1 keep-alive client on the same machine (loopback), up to 64 connections",
        "latency:  open loop from each request's scheduled send time; closed loop from its actual send time",
        "phases:   " + ", ".join(sorted(args.phases)) + (f" (dashboard: each URL {args.dashboard_duration:g} s at "
                                                          f"{args.dashboard_rate:g}/s)" if ui else ""),
        "cpu:      srv = the API process (and its threads), cli = this client, as a share of one core",
        "",
        HEADER,
        *(r.row() for r in results),
        "",
        f"errors:   {ERRORS or 'none'}",
        f"load average after the run: {' '.join(f'{x:.2f}' for x in os.getloadavg())} (other processes on the "
        "machine compete for its 2 cores; the p99 tail follows them)",
        *targets,
    ])
    print(report)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        with args.output.open("a") as f:
            f.write(report + "\n\n")
    return 0 if target_ok and ui_ok else 1


if __name__ == "__main__":
    sys.exit(main())

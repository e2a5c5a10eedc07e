"""Faults of the embedded default's SQLite file: a disk that fills up under a running server, and a
file or data directory that cannot be written. The API answers 503 problem+json with
``Retry-After`` (never a 500), reads keep working where SQLite can still read, and once writing is
possible again ``PRAGMA integrity_check`` passes, every earlier job is still readable and new jobs
run.

How the faults are made, without root-only mounts:

- *Full*: the test lowers ``RLIMIT_FSIZE`` of the running ``parplan serve`` process (``prlimit``)
  to one byte. From then on the kernel refuses every write that reaches past the limit, including
  writes through files the server already holds open: a write that starts below it is cut short and
  one that starts at or beyond it fails with EFBIG (Python ignores SIGXFSZ). SQLite reports a short
  write as SQLITE_FULL and a failed one as SQLITE_IOERR, the same two results a disk out of space
  (ENOSPC) or turned read-only under the server (EROFS) gives it, so the server's error paths are
  the ones a real full or failed disk takes. It is stricter than a full disk (rewriting space a file
  already has also fails), which gives a torn write more chances to corrupt the file, not fewer.
  Raising the limit again is the space coming back.
- *Read-only*: the server runs as the unprivileged user ``nobody`` (root ignores file modes; the
  process keeps only CAP_DAC_READ_SEARCH, so it can read the interpreter under /root but write only
  where ``nobody`` may) on a database it owns, and the test removes the write permission with
  chmod. Permissions are checked when a file is opened, so this is a fault of a server (re)started
  on the file: a running one keeps writing through the descriptors it holds, which is why
  "read-only while running" is exercised through the full disk above.
"""

from __future__ import annotations

import os
import pwd
import resource
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.service import (
    FAST_REQUEST,
    MEDIUM_REQUEST,
    Proc,
    finished,
    poll_job,
    service_env,
    start_server,
)

#: Seconds the disk stays full: longer than the lease, so the running job's renewals fail for
#: longer than it lasts and the sweeper has to hand it over once space is back.
FULL_SECONDS = 4.0


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "data"
    d.mkdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _env(data_dir: Path) -> dict[str, str]:
    return service_env({"PARPLAN_DATA_DIR": str(data_dir), "PARPLAN_SWEEP_INTERVAL_SECONDS": "0.3",
                        "PARPLAN_JOB_LEASE_SECONDS": "2", "PARPLAN_EXECUTOR_WORKERS": "1"})


def _bodies(n: int) -> list[dict[str, Any]]:
    """``n`` distinct fast requests (distinct cache keys: each makes a job and a plan)."""
    return [FAST_REQUEST | {"cluster": {"gpus": 2 ** (k + 1)}} for k in range(n)]


def _is_unavailable_problem(r: httpx.Response) -> bool:
    return (r.status_code == 503 and r.headers.get("content-type", "").startswith("application/problem+json")
            and r.json().get("type", "").endswith("/database-unavailable")
            and r.headers.get("retry-after", "").isdigit())


def _integrity(db: Path) -> list[str]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        return [row[0] for row in con.execute("PRAGMA integrity_check")]


def _run_jobs(c: httpx.Client, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    urls = [c.post("/v1/plans", json=b).headers["location"] for b in bodies]
    return [poll_job(c, u, finished, timeout=120) for u in urls]


def _still_readable(c: httpx.Client, jobs: list[dict[str, Any]]) -> None:
    for job in jobs:
        r = c.get(job["url"])
        assert r.status_code == 200, r.text
        again = r.json()["job"]
        assert (again["status"], again["plan_id"]) == (job["status"], job["plan_id"]), again
        plan = c.get(f"/v1/plans/{job['plan_id']}")
        assert plan.status_code == 200 and plan.json()["memory"]["peak_bytes"] > 0


def test_a_full_disk_answers_503_and_leaves_the_database_intact(data_dir: Path, procs: list[Proc]) -> None:
    server, base = start_server(_env(data_dir))
    procs.append(server)
    with httpx.Client(base_url=base, timeout=30) as c:
        earlier = _run_jobs(c, _bodies(2))
        running_url = c.post("/v1/plans", json=MEDIUM_REQUEST).headers["location"]
        poll_job(c, running_url, lambda j: j["status"] == "running")

        resource.prlimit(server.pid, resource.RLIMIT_FSIZE, (1, resource.RLIM_INFINITY))
        try:
            writes, reads = [], []
            full_until = time.monotonic() + FULL_SECONDS
            while time.monotonic() < full_until:
                writes.append(c.post("/v1/plans", json=FAST_REQUEST | {"cluster": {"gpus": 64}}))
                reads.append(c.get(earlier[0]["url"]))
                time.sleep(0.2)
        finally:
            resource.prlimit(server.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        bad = [(r.status_code, r.text[:200]) for r in writes if not _is_unavailable_problem(r)]
        assert not bad, f"new jobs while the disk is full must get 503 problems with Retry-After: {bad}"
        assert [r.status_code for r in reads] == [200] * len(reads)  # reading needs no space

        # Space is back: the same process writes again, the interrupted job ends once, new jobs run.
        assert poll_job(c, running_url, finished, timeout=120)["status"] == "succeeded"
        later = _run_jobs(c, _bodies(3)[2:])
        assert [j["status"] for j in later] == ["succeeded"]
        _still_readable(c, earlier)
    assert _integrity(data_dir / "parplan.db") == ["ok"]


def _as_nobody() -> list[str]:
    """A command prefix that runs a program as ``nobody``, able to read every file (the venv's
    interpreter lives under /root) but to write only where ``nobody`` may."""
    if os.geteuid() != 0:
        return []  # already unprivileged: file modes apply as they are
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: cannot run the server as an unprivileged user")
    nobody = pwd.getpwnam("nobody")
    return ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups",
            "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]


def _give_to_server_user(data_dir: Path) -> None:
    """Make ``nobody`` own the data directory and its files (when we are root), as a service user would."""
    if os.geteuid() == 0:
        nobody = pwd.getpwnam("nobody")
        for p in (data_dir, *data_dir.iterdir()):
            os.chown(p, nobody.pw_uid, nobody.pw_gid)


def _set_writable(data_dir: Path, writable: bool, *, directory: bool) -> None:
    """chmod the database files (and the directory, with ``directory``) read-only or back."""
    for p in data_dir.iterdir():
        p.chmod(0o644 if writable else 0o444)
    if directory:
        data_dir.chmod(0o755 if writable else 0o555)


def _phase_one(data_dir: Path, procs: list[Proc]) -> list[dict[str, Any]]:
    """Jobs run and stored by a server as ``nobody``, which then stops cleanly."""
    _give_to_server_user(data_dir)
    server, base = start_server(_env(data_dir), prefix=_as_nobody())
    procs.append(server)
    with httpx.Client(base_url=base, timeout=30) as c:
        jobs = _run_jobs(c, _bodies(2))
    server.kill(signal.SIGTERM)
    assert [j["status"] for j in jobs] == ["succeeded"] * 2
    return jobs


def _writable_again_and_intact(data_dir: Path, procs: list[Proc], earlier: list[dict[str, Any]]) -> None:
    """Permissions fixed and the server restarted: nothing lost or corrupted, and new jobs run."""
    _set_writable(data_dir, True, directory=True)
    assert _integrity(data_dir / "parplan.db") == ["ok"]
    server, base = start_server(_env(data_dir), prefix=_as_nobody())
    procs.append(server)
    with httpx.Client(base_url=base, timeout=30) as c:
        _still_readable(c, earlier)
        assert [j["status"] for j in _run_jobs(c, _bodies(3)[2:])] == ["succeeded"]


def test_a_read_only_database_file_answers_503_to_writes(data_dir: Path, procs: list[Proc]) -> None:
    earlier = _phase_one(data_dir, procs)
    _set_writable(data_dir, False, directory=False)
    server, base = start_server(_env(data_dir), prefix=_as_nobody())
    procs.append(server)
    with httpx.Client(base_url=base, timeout=30) as c:
        refused = c.post("/v1/plans", json=FAST_REQUEST | {"cluster": {"gpus": 64}})
        assert _is_unavailable_problem(refused), (refused.status_code, refused.text)
        assert "read-only" in refused.json()["detail"]
        # not ready either: it can only refuse jobs (the probe's write changes nothing)
        ready = c.get("/readyz")
        assert ready.status_code == 503 and "read-only" in ready.json()["detail"], (ready.status_code, ready.text)
        # Whether SQLite can still read a WAL database it may not write depends on the state of its
        # -wal and -shm files; either way a read answers its result or 503, never a 500.
        for job in earlier:
            r = c.get(job["url"])
            assert r.status_code == 200 or _is_unavailable_problem(r), (r.status_code, r.text)
    server.kill(signal.SIGTERM)
    _writable_again_and_intact(data_dir, procs, earlier)


def test_a_read_only_data_directory_stops_serve_with_one_clear_line(data_dir: Path, procs: list[Proc]) -> None:
    earlier = _phase_one(data_dir, procs)
    _set_writable(data_dir, False, directory=True)
    # Without its write-ahead log files and a directory to create them in, SQLite cannot even read a
    # WAL database: `parplan serve` says so at start-up instead of serving nothing but errors.
    proc = subprocess.run([*_as_nobody(), sys.executable, "-m", "parplan.cli", "serve", "--port", "0"],
                          env=_env(data_dir), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    error = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(error) == 1 and "read-only" in error[0] and str(data_dir) in error[0], proc.stderr
    _writable_again_and_intact(data_dir, procs, earlier)


def test_the_read_only_simulation_really_refuses_writes(data_dir: Path) -> None:
    """The premise of the two tests above: the server's user cannot write a chmod'ed file (as root
    it could, and the tests would prove nothing)."""
    target = data_dir / "probe"
    target.write_text("x")
    _give_to_server_user(data_dir)
    _set_writable(data_dir, False, directory=False)
    probe = subprocess.run([*_as_nobody(), sys.executable, "-c", f"open({str(target)!r}, 'a')"],
                           capture_output=True, text=True, timeout=30)
    assert probe.returncode != 0 and "PermissionError" in probe.stderr, probe.stderr

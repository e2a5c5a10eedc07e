"""Test support for the service and workers, shared by ``tests/service``, ``tests/workers`` and
anything else that needs a live service (the agent's tests): real PostgreSQL and Redis, a test
database per session built with ``alembic upgrade head``, per-test transactions rolled back, and
``parplan serve`` / ``parplan worker`` as real subprocesses.

Servers come from ``PARPLAN_TEST_POSTGRES_URL`` (an admin URL; default the local ``postgres``
role) and ``PARPLAN_TEST_REDIS_URL``. When one is unreachable the tests that need it are skipped,
except under ``CI=true``, where that is a failure.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
import pytest
import redis
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from parplan.service.auth.service import Scope, create_token
from parplan.service.database import Base, make_engine, utcnow
from parplan.service.migrate import upgrade
from parplan.service.models import Job, JobStatus
from parplan.service.settings import AuthMode, Settings

POSTGRES_ADMIN_URL = os.environ.get("PARPLAN_TEST_POSTGRES_URL",
                                    "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("PARPLAN_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
#: The command that (re)starts the machine's Redis: no persistence, so a restart empties it.
REDIS_START = ["redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "-::1", "--port", "6379", "--save", "",
               "--appendonly", "no", "--dir", "/var/lib/redis", "--logfile", "/var/log/redis/ci.log"]

# Solve times move as the solver changes: these three are the only places tests pick them.
#: A request that solves in well under a second (for end-to-end tests).
FAST_REQUEST: dict[str, Any] = {"model": {"preset": "bert-large"}, "cluster": {"gpus": 2}, "search": "dp"}
#: A request whose solve takes a few seconds: fault tests kill a worker in the middle of it (as
#: soon as the job is running) and then let it finish on another.
MEDIUM_REQUEST: dict[str, Any] = {"model": {"preset": "llama-2-70b"}, "cluster": {"gpus": 64}, "search": "dp"}
#: A request whose solve takes several seconds to a minute: tests that cancel or interrupt a solve
#: (and never wait for its end).
SLOW_REQUEST: dict[str, Any] = {"model": {"preset": "gpt3-175b"}, "cluster": {"gpus": 1024}}


def unreachable(what: str, why: str) -> None:
    """Skip, or fail under CI=true, because a server the test needs is not there."""
    msg = f"{what} is not reachable ({why}); scripts/test starts it"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{msg} (CI=true: a missing server is a failure)")
    pytest.skip(msg)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# -- PostgreSQL -------------------------------------------------------------------------------------

def _admin_engine() -> Engine:
    return create_engine(POSTGRES_ADMIN_URL, poolclass=NullPool, isolation_level="AUTOCOMMIT")


def create_database(name: str) -> str:
    """A fresh PostgreSQL database ``name`` (dropped first if it exists), migrated to head; its URL."""
    admin = _admin_engine()
    try:
        with admin.connect() as c:
            drop_database(name, c)
            c.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        admin.dispose()
    url = make_url(POSTGRES_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    upgrade(url)
    return url


def drop_database(name: str, conn: Any = None) -> None:
    def run(c: Any) -> None:
        c.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n "
                       "AND pid <> pg_backend_pid()"), {"n": name})
        c.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
    if conn is not None:
        run(conn)
        return
    admin = _admin_engine()
    try:
        with admin.connect() as c:
            run(c)
    finally:
        admin.dispose()


def postgres_available() -> str | None:
    """None when the admin URL answers, else why not."""
    try:
        eng = _admin_engine()
        with eng.connect() as c:
            c.execute(text("SELECT 1"))
        eng.dispose()
        return None
    except Exception as e:
        return f"{e.__class__.__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def redis_available(url: str = REDIS_URL) -> str | None:
    try:
        r = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=2)
        r.ping()
        r.close()
        return None
    except redis.RedisError as e:
        return f"{e.__class__.__name__}: {e}"


def truncate_all(engine: Engine, attempts: int = 5) -> None:
    """Empty every table. A process a test started may still be finishing a transaction (a worker
    resumed after SIGSTOP, a solver child in its own session); PostgreSQL then may pick the
    TRUNCATE as a deadlock's victim (seen once after test_hung_worker), so it is tried again."""
    names = ", ".join(t.name for t in Base.metadata.sorted_tables)
    for attempt in range(attempts):
        try:
            with engine.begin() as c:
                c.execute(text(f"TRUNCATE {names} CASCADE"))
            return
        except OperationalError as e:
            if "deadlock" not in str(e).lower() or attempt == attempts - 1:
                raise
            time.sleep(0.2 * (attempt + 1))


@contextlib.contextmanager
def rollback_sessions(engine: Engine) -> Iterator[sessionmaker[Session]]:
    """A session factory whose sessions all live inside one outer transaction, rolled back at the
    end: commits become savepoint releases, so each test leaves the database as it found it."""
    conn = engine.connect()
    outer = conn.begin()
    try:
        yield sessionmaker(bind=conn, expire_on_commit=False, autoflush=False,
                           join_transaction_mode="create_savepoint")
    finally:
        outer.rollback()
        conn.close()


def make_token(session_factory: Callable[[], Session], *scopes: Scope, name: str = "test") -> str:
    with session_factory() as s:
        _, secret = create_token(s, name, frozenset(scopes))
        s.commit()
    return secret


def restart_redis() -> None:
    """Stop the machine's Redis (nothing saved) and start it again with :data:`REDIS_START`."""
    r = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1, socket_timeout=5)
    with contextlib.suppress(redis.ConnectionError):
        r.shutdown(nosave=True)
    r.close()
    deadline = time.monotonic() + 10
    while redis_available() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    subprocess.run(REDIS_START, check=True, capture_output=True, timeout=30)
    deadline = time.monotonic() + 15
    while (why := redis_available()) is not None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"redis did not come back: {why}")
        time.sleep(0.05)


# -- subprocesses -----------------------------------------------------------------------------------

def service_env(settings_env: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARPLAN_")}
    env.update(settings_env)
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class Proc:
    """A ``parplan`` subprocess in its own process group, its output in a log file."""

    args: list[str]
    env: dict[str, str]
    log_path: Path = field(default_factory=lambda: Path(tempfile.mkstemp(prefix="parplan-test-", suffix=".log")[1]))
    popen: subprocess.Popen[bytes] | None = None
    node_name: str | None = None  # a worker's Celery node name
    #: A command the process runs under, e.g. ``setpriv ...`` to run it as another user.
    prefix: Sequence[str] = ()
    _log: IO[bytes] | None = None

    def start(self) -> Proc:
        self._log = self.log_path.open("ab")
        self.popen = subprocess.Popen([*self.prefix, sys.executable, "-m", "parplan.cli", *self.args], env=self.env,
                                      stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def wait_for_output(self, needle: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.output():
            if not self.alive():
                raise RuntimeError(f"{self.args[0]} exited ({self.popen and self.popen.returncode}):\n"
                                   f"{self.output()[-4000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{needle!r} not seen in {timeout}s:\n{self.output()[-4000:]}")
            time.sleep(0.05)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole process group (the worker, its pool and its solver children)."""
        if self.popen is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)
        try:
            self.popen.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=15)
        # Reap the group's stragglers: wait until no process of the group is left.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.killpg(self.popen.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)

    def stop(self) -> None:
        if self.alive():
            self.kill(signal.SIGTERM)
        if self._log is not None:
            self._log.close()
            self._log = None


def solver_children(pgid: int) -> list[int]:
    """Pids of solver processes whose parent belongs to process group ``pgid`` (Linux /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if b"parplan.workers.solve_process" not in (entry / "cmdline").read_bytes():
                continue
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if os.getpgid(ppid) == pgid:
                out.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return out


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def start_server(env: dict[str, str], *extra: str, host: str = "127.0.0.1",
                 timeout: float = 30.0, prefix: Sequence[str] = ()) -> tuple[Proc, str]:
    """``parplan serve`` on a free port (bound to ``host``), run under ``prefix`` (see :class:`Proc`);
    returns the process and its loopback base URL once /healthz answers."""
    port = free_port()
    proc = Proc(["serve", "--host", host, "--port", str(port), *extra], env, prefix=prefix).start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(base + "/healthz", timeout=1.0).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        if not proc.alive() or time.monotonic() > deadline:
            out = proc.output()
            proc.stop()
            raise RuntimeError(f"parplan serve did not come up:\n{out[-4000:]}")
        time.sleep(0.1)


def start_worker(env: dict[str, str], concurrency: int = 1, timeout: float = 60.0) -> Proc:
    """``parplan worker`` (Celery), returned once it reports ready."""
    name = f"test-{uuid.uuid4().hex[:8]}@{socket.gethostname()}"
    proc = Proc(["worker", "--concurrency", str(concurrency), "--hostname", name, "--log-level", "info"], env).start()
    proc.node_name = name
    proc.wait_for_output("ready.", timeout=timeout)
    return proc


def poll_job(client: httpx.Client, job_url: str, until: Callable[[dict[str, Any]], bool],
             timeout: float = 90.0, interval: float = 0.05) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        r = client.get(job_url)
        r.raise_for_status()
        job: dict[str, Any] = r.json()["job"]
        if until(job):
            return job
        if time.monotonic() > deadline:
            raise TimeoutError(f"job did not reach the expected state in {timeout}s: {job}")
        time.sleep(interval)


def finished(job: Mapping[str, Any]) -> bool:
    return job["status"] in ("succeeded", "failed", "cancelled")


def settings_env(database_url: str, broker_url: str | None, queue: str, **more: Any) -> dict[str, str]:
    env = {"PARPLAN_DATABASE_URL": database_url, "PARPLAN_QUEUE_NAME": queue, "PARPLAN_AUTH": "required",
           "PARPLAN_JOB_LEASE_SECONDS": "2", "PARPLAN_JOB_REQUEUE_SECONDS": "2",
           "PARPLAN_SWEEP_INTERVAL_SECONDS": "0.3", "PARPLAN_AGENT_TIMEOUT_SECONDS": "2"}
    if broker_url:
        env["PARPLAN_BROKER_URL"] = broker_url
    env.update({f"PARPLAN_{k.upper()}": str(v) for k, v in more.items()})
    return env


def make_settings(database_url: str, broker_url: str | None, queue: str, **more: Any) -> Settings:
    """Settings for an in-test app: tokens required, no sweeper thread (tests call ``sweep``)."""
    return Settings(database_url=database_url, broker_url=broker_url, queue_name=queue, auth=AuthMode.REQUIRED,
                    sweeper=False, **more)


def engine_for(url: str) -> Engine:
    return make_engine(url, pool_size=5, max_overflow=5)


# -- pytest fixtures (import them into a conftest with ``from tests.support.service import *``) --

@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    why = postgres_available()
    if why is not None:
        unreachable("PostgreSQL", why)
    name = f"parplan_test_{os.getpid()}"
    url = create_database(name)
    yield url
    drop_database(name)


@pytest.fixture(scope="session")
def pg_engine(pg_url: str) -> Iterator[Engine]:
    eng = engine_for(pg_url)
    yield eng
    eng.dispose()


@pytest.fixture(scope="session")
def redis_url() -> str:
    why = redis_available()
    if why is not None:
        unreachable("Redis", why)
    return REDIS_URL


@pytest.fixture
def queue_name() -> str:
    return f"parplan-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def db(pg_engine: Engine) -> Iterator[sessionmaker[Session]]:
    """Sessions inside a transaction that is rolled back after the test."""
    with rollback_sessions(pg_engine) as factory:
        yield factory


@pytest.fixture
def committed_db(pg_engine: Engine) -> Iterator[sessionmaker[Session]]:
    """Sessions that really commit (for tests with other processes); tables emptied afterwards."""
    truncate_all(pg_engine)
    yield sessionmaker(bind=pg_engine, expire_on_commit=False, autoflush=False)
    truncate_all(pg_engine)


__all__ = ["committed_db", "db", "pg_engine", "pg_url", "queue_name", "redis_url"]


def insert_job(sf: sessionmaker[Session], request: dict[str, Any], request_hash: str, cache_key: str,
               **fields: Any) -> uuid.UUID:
    """A queued job row, committed (``fields`` override any column); its id."""
    now = utcnow()
    with sf() as s:
        job = Job(status=JobStatus.QUEUED.value, request=request, request_hash=request_hash, cache_key=cache_key,
                  progress_stage="queued", progress_fraction=0.0, attempts=0, created_at=now, updated_at=now,
                  enqueued_at=now)
        for k, v in fields.items():
            setattr(job, k, v)
        s.add(job)
        s.commit()
        return job.id


def load_job(sf: sessionmaker[Session], job_id: uuid.UUID) -> Job:
    """The job row as committed now."""
    with sf() as s:
        job = s.get(Job, job_id)
        assert job is not None
        return job

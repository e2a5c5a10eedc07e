"""A private PostgreSQL cluster for fault tests that stop and restart the database server.

The machine's shared PostgreSQL is never touched: :class:`PrivateCluster` runs ``initdb`` on a
temporary data directory and serves it on a free port (trust authentication, loopback only, a
Unix socket in the data directory), so a test may stop it (``fast`` or ``immediate``) and start it
again. ``initdb`` refuses to run as root, so as root every command runs as the ``postgres`` user
(``runuser``), which then owns the data directory.

:func:`find_binaries` locates the server programs (``/usr/lib/postgresql/<version>/bin``, or
``PARPLAN_TEST_PG_BIN``); without them (or, as root, without ``runuser`` and a ``postgres`` user)
:class:`ClusterUnavailableError` is raised, and the tests are skipped, or fail under ``CI=true``.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from parplan.service.migrate import upgrade
from tests.support.service import free_port


def find_binaries() -> Path:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres`` (the newest version);
    ClusterUnavailableError when there is none."""
    env = os.environ.get("PARPLAN_TEST_PG_BIN")
    candidates = [Path(env)] if env else sorted(Path("/usr/lib/postgresql").glob("*/bin"),
                                                 key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
                                                 reverse=True)
    for d in candidates:
        if all((d / b).is_file() for b in ("initdb", "pg_ctl", "postgres")):
            return d
    raise ClusterUnavailableError("no initdb, pg_ctl and postgres under /usr/lib/postgresql/*/bin "
                                  "(or PARPLAN_TEST_PG_BIN)")


class ClusterUnavailableError(Exception):
    """A private cluster cannot be made on this machine (the test is skipped, or fails under CI)."""


def _run_as() -> list[str]:
    """The prefix that runs a server command as an unprivileged user when we are root."""
    if os.geteuid() != 0:
        return []
    if shutil.which("runuser") is None:
        raise ClusterUnavailableError("running as root without runuser: cannot run initdb as the postgres user")
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise ClusterUnavailableError("running as root and there is no postgres user to run initdb as") from None
    return ["runuser", "-u", "postgres", "--"]


class PrivateCluster:
    """``initdb`` + ``pg_ctl`` on a temporary directory and a free port; :meth:`url` reaches it."""

    def __init__(self, bin_dir: Path) -> None:
        self._prefix = _run_as()
        self.bin_dir = bin_dir
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="parplan-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        if self._prefix:
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)

    def _cmd(self, *args: str, timeout: float = 60.0) -> None:
        proc = subprocess.run([*self._prefix, *args], capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}\n"
                               f"{self.server_log()[-2000:]}")

    def server_log(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def init(self) -> PrivateCluster:
        self._cmd(str(self.bin_dir / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust",
                  "--no-sync", "-E", "UTF8", "--locale=C")
        return self

    def start(self) -> None:
        """Start the server and wait until it accepts connections (``pg_ctl -w``)."""
        opts = (f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.data} -c fsync=off "
                "-c full_page_writes=off -c max_connections=60")
        self._cmd(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", opts,
                  "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m fast`` (clients disconnected, clean shutdown) or ``immediate`` (the
        server processes quit at once, as in a crash; the next start runs crash recovery)."""
        self._cmd(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def migrate(self) -> str:
        """Build the schema (``alembic upgrade head``) in the ``postgres`` database; its URL."""
        upgrade(self.url())
        return self.url()

    def destroy(self) -> None:
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


def wait_until(check: Callable[[], object], timeout: float, what: str, interval: float = 0.1) -> None:
    """Poll ``check()`` until it is truthy; TimeoutError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:g}s")
        time.sleep(interval)

"""One solve in its own process, so a worker can cancel it (terminate) and never blocks on it.

Parent side: :class:`SolveProcess` starts ``python -m parplan.workers.solve_process``, writes one
JSON line ``{"request": body, "calibration": dict | null}`` to its stdin and keeps stdin open;
it reads JSON lines back: ``{"progress": {"stage", "fraction"}}`` as the solver reports,
then ``{"plan": document}`` or ``{"error": {"code", "type", "message"}}``.

Child side (:func:`main`): the protocol goes over the original stdout; fd 1 is pointed at stderr so
whatever a solver library prints cannot corrupt it. When stdin reaches EOF (the parent died or gave
up) the child exits at once, so an orphaned solve never outlives its worker. It ignores SIGINT and
SIGTERM (a Ctrl+C or ``docker stop`` reaches the whole process group; the parent decides whether
the job is released or finished) and is stopped with SIGKILL.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Mapping
from typing import IO, Any

#: Exit status of a child whose parent went away.
ORPHANED = 70


class SolveProcess:
    """Handle on one solver child process."""

    def __init__(self, request: Mapping[str, Any], calibration: Mapping[str, Any] | None, nice: int = 0) -> None:
        """Start the child; ``nice``: how much lower its CPU priority is than this process's."""
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "parplan.workers.solve_process", str(nice)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True,
            # Its own session: signals meant for the worker's process group (Ctrl+C, docker stop,
            # a SIGKILL of the group) do not reach it; it follows its parent through stdin instead.
            start_new_session=True)
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._stdin: IO[bytes] = self._proc.stdin
        self._fd = self._proc.stdout.fileno()
        os.set_blocking(self._fd, False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._fd, selectors.EVENT_READ)
        self._buf = bytearray()
        self._eof = False
        self._stdin.write(json.dumps({"request": dict(request), "calibration": calibration}).encode() + b"\n")
        self._stdin.flush()

    @property
    def pid(self) -> int:
        return self._proc.pid

    def read(self, timeout: float) -> list[dict[str, Any]]:
        """Messages that arrived within ``timeout`` seconds (possibly none)."""
        deadline = time.monotonic() + timeout
        out: list[dict[str, Any]] = []
        while not out and not self._eof:
            left = deadline - time.monotonic()
            if left <= 0 or not self._sel.select(left):
                break
            while True:
                try:
                    chunk = os.read(self._fd, 1 << 20)
                except BlockingIOError:
                    break
                if not chunk:
                    self._eof = True
                    break
                self._buf += chunk
            while (nl := self._buf.find(b"\n")) >= 0:
                line, self._buf = bytes(self._buf[:nl]), self._buf[nl + 1:]
                if line.strip():
                    out.append(json.loads(line))
        return out

    @property
    def finished(self) -> bool:
        """True once the child closed its output and exited."""
        return self._eof and self._proc.poll() is not None

    def exit_description(self) -> str:
        code = self._proc.wait(timeout=5)
        return f"killed by signal {-code}" if code < 0 else f"exited with status {code}"

    def kill(self) -> None:
        """Stop the child at once (SIGKILL: a solve has nothing to clean up) and reap it."""
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self.close()

    def close(self) -> None:
        for f in (self._stdin, self._proc.stdout):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass
        self._sel.close()
        if self._proc.poll() is None:
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


def _watch_parent() -> None:
    """Exit as soon as the parent closes our stdin (it died, or gave up on us)."""
    try:
        while sys.stdin.buffer.read(4096):
            pass
    finally:
        os._exit(ORPHANED)


def main() -> int:
    # Ctrl+C or a SIGTERM sent to the whole process group is for the parent, which decides what
    # happens to the job (release it, or kill us); the child only dies by SIGKILL or orphaning.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    nice = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    if nice > 0:
        os.nice(nice)  # the API's requests first (Settings.solver_nice)
    proto = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # stray prints from solver libraries go to stderr

    def send(msg: dict[str, Any]) -> None:
        try:
            proto.write(json.dumps(msg, allow_nan=True).encode() + b"\n")
        except (BrokenPipeError, OSError):
            os._exit(ORPHANED)

    line = sys.stdin.buffer.readline()
    if not line:
        return ORPHANED
    threading.Thread(target=_watch_parent, name="parent-watch", daemon=True).start()
    try:
        from parplan.solver.calibration import DEFAULT_CALIBRATION, Calibration
        from parplan.solver.errors import SolverError
        from parplan.solver.planner import solve
        from parplan.solver.request import parse_plan_request

        msg = json.loads(line)
        last = [0.0]

        def progress(stage: str, fraction: float) -> None:
            now = time.monotonic()
            if now - last[0] >= 0.1 or fraction >= 1.0 or fraction == 0.0:
                last[0] = now
                send({"progress": {"stage": str(stage), "fraction": float(fraction)}})

        try:
            cal = Calibration.from_dict(msg["calibration"]) if msg.get("calibration") else DEFAULT_CALIBRATION
            doc = solve(parse_plan_request(msg["request"], cal), progress)
        except SolverError as e:
            send({"error": {"code": "unsolvable", "type": type(e).__name__, "message": str(e)}})
            return 0
        send({"plan": doc})
        return 0
    except Exception as e:  # reported to the parent, which fails the job with it
        traceback.print_exc()
        send({"error": {"code": "internal", "type": type(e).__name__, "message": str(e)}})
        return 1


if __name__ == "__main__":
    sys.exit(main())

"""The agent's side of the validation protocol (HTTP, httpx).

:class:`ServiceClient` speaks the protocol — register, heartbeat, long-poll for a validation,
post its result, post a hardware profile — retrying connection errors, timeouts and 5xx/429
answers with exponential backoff. :class:`Agent` is the loop around it: register, heartbeat from
a background thread, post micro-benchmarks once, then claim → run → post until stopped
(:meth:`Agent.stop`, which ``parplan agent`` calls on SIGTERM/SIGINT: the validation in progress
is finished and posted, no new one is claimed).
"""

from __future__ import annotations

import logging
import random
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import httpx

log = logging.getLogger("parplan.agent")

#: HTTP statuses worth retrying: the service is restarting or overloaded.
RETRY_STATUSES = frozenset({429, 502, 503, 504})


class ProtocolError(RuntimeError):
    """The service answered something the protocol does not allow (or a 4xx)."""


class StoppedError(RuntimeError):
    """The agent was asked to stop while waiting to retry."""


class ServiceClient:
    """HTTP client for ``/v1/agents``, ``/v1/validations`` and ``/v1/profiles``."""

    def __init__(self, server: str, token: str, *, retries: int = 5, backoff_s: float = 0.5,
                 max_backoff_s: float = 30.0, timeout_s: float = 10.0,
                 transport: httpx.BaseTransport | None = None, stop: threading.Event | None = None) -> None:
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.timeout_s = timeout_s
        self.stop_event = stop or threading.Event()
        self._http = httpx.Client(base_url=server.rstrip("/"), transport=transport,
                                  headers={"Authorization": f"Bearer {token}", "User-Agent": "parplan-agent"},
                                  timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, body: dict[str, Any] | None = None,
                timeout_s: float | None = None, *, interruptible: bool = True) -> httpx.Response:
        """One call with retries; returns the (2xx) response, ProtocolError on a 4xx or when the
        retries are spent. ``interruptible``: a stop request ends the waiting (StoppedError)."""
        attempt = 0
        while True:
            try:
                resp = self._http.request(method, path, json=body,
                                          timeout=timeout_s if timeout_s is not None else self.timeout_s)
            except httpx.TransportError as e:
                error = f"{type(e).__name__}: {e}"
            else:
                if resp.status_code < 400:
                    return resp
                if resp.status_code not in RETRY_STATUSES and resp.status_code < 500:
                    raise ProtocolError(f"{method} {path}: HTTP {resp.status_code}: {resp.text[:500]}")
                error = f"HTTP {resp.status_code}"
            attempt += 1
            if attempt > self.retries:
                raise ProtocolError(f"{method} {path}: giving up after {self.retries} retries ({error})")
            delay = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1)) * (0.5 + random.random() / 2)
            log.warning("%s %s failed (%s); retry %d/%d in %.1fs", method, path, error, attempt, self.retries, delay)
            if not interruptible:
                time.sleep(delay)
            elif self.stop_event.wait(delay):
                raise StoppedError(f"{method} {path}: stopped while retrying")

    # ------------------------------------------------------------------ protocol
    def register(self, name: str, hardware: dict[str, Any]) -> str:
        resp = self.request("POST", "/v1/agents/register", {"name": name, "hardware": hardware})
        try:
            agent_id = str(resp.json()["agent"]["id"])
        except (ValueError, KeyError, TypeError):
            raise ProtocolError(f"register: unexpected answer {resp.text[:300]!r}") from None
        return agent_id

    def heartbeat(self, agent_id: str) -> None:
        self.request("POST", f"/v1/agents/{agent_id}/heartbeat", {})

    def claim(self, agent_id: str, wait_seconds: int) -> dict[str, Any] | None:
        """The next validation, or None (204) when there was none within ``wait_seconds``."""
        wait = max(0, min(30, int(wait_seconds)))
        resp = self.request("POST", "/v1/validations/claim", {"agent_id": agent_id, "wait_seconds": wait},
                            timeout_s=self.timeout_s + wait)
        if resp.status_code == 204 or not resp.content:
            return None
        try:
            validation = resp.json()["validation"]
        except (ValueError, KeyError, TypeError):
            raise ProtocolError(f"claim: unexpected answer {resp.text[:300]!r}") from None
        if not isinstance(validation, dict) or "id" not in validation:
            raise ProtocolError("claim: the validation has no id")
        return validation

    def post_result(self, validation_id: str, body: dict[str, Any]) -> None:
        # A result is posted even while stopping: the work is done, only the answer is missing.
        self.request("POST", f"/v1/validations/{validation_id}/result", body, interruptible=False)

    def post_profile(self, body: dict[str, Any]) -> None:
        self.request("POST", "/v1/profiles", body)


Runner = Callable[[dict[str, Any]], dict[str, Any]]
Profiler = Callable[[], dict[str, Any]]


class Agent:
    """Register, heartbeat, post a profile, then claim and run validations until stopped."""

    def __init__(self, client: ServiceClient, name: str, hardware: dict[str, Any], run: Runner,
                 profiler: Profiler | None = None, *, wait_seconds: int = 30, heartbeat_s: float = 15.0,
                 max_validations: int | None = None) -> None:
        self.client = client
        self.name = name
        self.hardware = hardware
        self.run_validation = run
        self.profiler = profiler
        self.wait_seconds = wait_seconds
        self.heartbeat_s = heartbeat_s
        self.max_validations = max_validations
        self.agent_id: str | None = None
        self.completed = 0
        self._heartbeat: threading.Thread | None = None

    @property
    def stopping(self) -> bool:
        return self.client.stop_event.is_set()

    def stop(self) -> None:
        """Finish what is running, claim nothing more (safe from a signal handler)."""
        self.client.stop_event.set()

    def _beat(self) -> None:
        assert self.agent_id is not None
        while not self.client.stop_event.wait(self.heartbeat_s):
            try:
                self.client.heartbeat(self.agent_id)
            except (ProtocolError, StoppedError) as e:
                log.warning("heartbeat failed: %s", e)

    def run(self) -> int:
        """The agent's life; returns the number of validations it completed."""
        try:
            self.agent_id = self.client.register(self.name, self.hardware)
        except StoppedError:
            return 0
        log.info("registered as agent %s (%s)", self.agent_id, self.hardware.get("key"))
        self._heartbeat = threading.Thread(target=self._beat, name="parplan-heartbeat", daemon=True)
        self._heartbeat.start()
        try:
            if self.profiler is not None and not self.stopping:
                self._post_profile()
            while not self.stopping:
                if self.max_validations is not None and self.completed >= self.max_validations:
                    break
                try:
                    validation = self.client.claim(self.agent_id, self.wait_seconds)
                except StoppedError:
                    break
                except ProtocolError as e:
                    log.error("claim failed: %s", e)
                    if self.client.stop_event.wait(self.client.backoff_s):
                        break
                    continue
                if validation is None:
                    continue
                self._handle(validation)
        finally:
            self.client.stop_event.set()
            if self._heartbeat is not None:
                self._heartbeat.join(timeout=5)
            log.info("agent %s stopped after %d validation(s)", self.agent_id, self.completed)
        return self.completed

    def _post_profile(self) -> None:
        assert self.profiler is not None
        try:
            data = self.profiler()
            self.client.post_profile({"hardware_key": self.hardware["key"], "kind": "microbenchmark", "data": data,
                                      "agent_id": self.agent_id})
            log.info("posted micro-benchmark profile for %s", self.hardware["key"])
        except (ProtocolError, StoppedError) as e:
            log.error("posting the profile failed: %s", e)
        except Exception:  # a benchmark failure must not keep the agent from validating
            log.exception("micro-benchmarks failed")

    def _handle(self, validation: dict[str, Any]) -> None:
        vid = str(validation["id"])
        log.info("running validation %s (plan %s)", vid, validation.get("plan_id"))
        started = time.monotonic()
        try:
            measurement = self.run_validation(validation)
            body: dict[str, Any] = {"agent_id": self.agent_id, "status": "succeeded", "error": None,
                                    "measurement": measurement}
        except Exception as e:
            log.error("validation %s failed: %s", vid, e)
            log.debug("%s", traceback.format_exc())
            body = {"agent_id": self.agent_id, "status": "failed", "error": f"{type(e).__name__}: {e}"[:4000],
                    "measurement": None}
        try:
            self.client.post_result(vid, body)
        except (ProtocolError, StoppedError) as e:
            log.error("posting the result of validation %s failed: %s", vid, e)
            return
        self.completed += 1
        log.info("validation %s %s in %.1fs", vid, body["status"], time.monotonic() - started)

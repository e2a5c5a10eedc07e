"""A small in-test HTTP server implementing the agent side of the validation protocol.

A fake of the external parplan service (which another engineer is building): exactly the
endpoints and bodies the agent uses — ``POST /v1/agents/register`` (201), ``POST
/v1/agents/{id}/heartbeat`` (200), ``POST /v1/validations/claim`` (200 with a validation or 204
after a long poll of up to ``wait_seconds``), ``POST /v1/validations/{id}/result`` (200) and
``POST /v1/profiles`` (201) — with Bearer-token checks, request-shape checks (422 on a bad body)
and a record of everything it received. ``fail_next`` makes the next N requests answer 503.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HARDWARE_KEYS = {"key", "device", "device_name", "device_count", "memory_bytes", "torch_version"}


class FakeService:
    def __init__(self, token: str = "agent-token", port: int = 0) -> None:
        self.token = token
        self.lock = threading.Condition()
        self.queue: list[dict[str, Any]] = []
        self.agents: dict[str, dict[str, Any]] = {}
        self.heartbeats: list[str] = []
        self.claims: list[dict[str, Any]] = []
        self.results: dict[str, dict[str, Any]] = {}
        self.profiles: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str, int]] = []
        self.fail_next = 0
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                status, body = service.handle(self.path, self.headers.get("Authorization", ""),
                                              self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                service.requests.append(("POST", self.path, status))
                self.send_response(status)
                if body is None:
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = json.dumps(body).encode()
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeService:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def enqueue(self, validation: dict[str, Any]) -> None:
        with self.lock:
            self.queue.append(validation)
            self.lock.notify_all()

    # ------------------------------------------------------------------ the protocol
    def handle(self, path: str, auth: str, raw: bytes) -> tuple[int, dict[str, Any] | None]:
        with self.lock:
            if self.fail_next > 0:
                self.fail_next -= 1
                return 503, {"title": "unavailable"}
        if auth != f"Bearer {self.token}":
            return 401, {"title": "unauthorized", "status": 401}
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            return 422, {"title": "bad json"}
        if path == "/v1/agents/register":
            hw = body.get("hardware")
            if not isinstance(body.get("name"), str) or not isinstance(hw, dict) or set(hw) != HARDWARE_KEYS \
                    or hw["device"] not in ("cpu", "cuda"):
                return 422, {"title": "bad agent", "body": body}
            agent_id = uuid.uuid4().hex
            self.agents[agent_id] = body
            return 201, {"agent": {"id": agent_id, "name": body["name"], "hardware": hw}}
        m = re.fullmatch(r"/v1/agents/([0-9a-f]+)/heartbeat", path)
        if m:
            if m.group(1) not in self.agents:
                return 404, {"title": "no such agent"}
            self.heartbeats.append(m.group(1))
            return 200, {"agent": {"id": m.group(1)}}
        if path == "/v1/validations/claim":
            wait = body.get("wait_seconds")
            if body.get("agent_id") not in self.agents or not isinstance(wait, int) or not 0 <= wait <= 30:
                return 422, {"title": "bad claim", "body": body}
            self.claims.append(body)
            with self.lock:
                if not self.queue:
                    self.lock.wait(timeout=wait)
                if not self.queue:
                    return 204, None
                return 200, {"validation": self.queue.pop(0)}
        m = re.fullmatch(r"/v1/validations/([^/]+)/result", path)
        if m:
            if body.get("agent_id") not in self.agents or body.get("status") not in ("succeeded", "failed"):
                return 422, {"title": "bad result", "body": body}
            if body["status"] == "succeeded" and not isinstance(body.get("measurement"), dict):
                return 422, {"title": "a succeeded result needs a measurement"}
            self.results[m.group(1)] = body
            return 200, {"validation": {"id": m.group(1), "status": body["status"]}}
        if path == "/v1/profiles":
            data = body.get("data")
            if not isinstance(body.get("hardware_key"), str) or body.get("kind") != "microbenchmark" \
                    or not isinstance(data, dict) or set(body) - {"hardware_key", "kind", "data", "agent_id"}:
                return 422, {"title": "bad profile"}
            self.profiles.append(body)
            return 201, {"profile": {"id": uuid.uuid4().hex}}
        return 404, {"title": "not found"}

"""Request body size limit (pure ASGI, before anything reads the body): 413 problem+json.

A declared ``Content-Length`` over the limit is refused at once. A body without one (chunked) is
read here up to the limit and refused as soon as it passes it; otherwise it is replayed to the app.
"""

from __future__ import annotations

from typing import Any

from parplan.service.problems import PROBLEM_JSON

Scope = dict[str, Any]
Message = dict[str, Any]


class BodyLimitMiddleware:
    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def _reject(self, send: Any) -> None:
        body = (b'{"type":"https://parplan.dev/problems/too-large","title":"Content Too Large","status":413,'
                b'"detail":"the request body is larger than the limit of %d bytes (PARPLAN_MAX_BODY_BYTES)"}'
                % self.max_bytes)
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", PROBLEM_JSON.encode()), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared: int | None = None
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = None
                break
        if declared is not None:
            if declared > self.max_bytes:
                await self._reject(send)
                return
            await self.app(scope, receive, send)
            return
        # No declared length: buffer up to the limit, then replay.
        buffered: list[Message] = []
        size = 0
        while True:
            message: Message = await receive()
            buffered.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                await self._reject(send)
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            if buffered:
                return buffered.pop(0)
            msg: Message = await receive()
            return msg

        await self.app(scope, replay, send)

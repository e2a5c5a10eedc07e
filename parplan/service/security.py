"""Response headers every answer carries, and CORS only where configured.

- ``X-Content-Type-Options: nosniff`` and ``Referrer-Policy: no-referrer`` on every response;
- on HTML (``/docs``, dashboards): ``Content-Security-Policy`` forbidding framing by other sites
  (``frame-ancestors 'none'``, plugins and ``<base>`` tags) and ``X-Frame-Options: DENY``;
- CORS: none unless ``PARPLAN_CORS_ORIGINS`` names origins (then Starlette's CORS middleware,
  without credentials: the API authenticates with bearer headers, never cookies).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from parplan.service.settings import Settings

HTML_CSP = "frame-ancestors 'none'; object-src 'none'; base-uri 'none'"
_ALWAYS = [(b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer")]
_HTML = [(b"content-security-policy", HTML_CSP.encode()), (b"x-frame-options", b"DENY")]


class SecurityHeadersMiddleware:
    """Pure ASGI: adds the headers above to each response start (keeping any the app set)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                html = any(name.lower() == b"content-type" and value.startswith(b"text/html")
                           for name, value in headers)
                headers += [(n, v) for n, v in _ALWAYS + (_HTML if html else []) if n not in present]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def install(app: FastAPI, settings: Settings) -> None:
    origins = settings.cors_origin_list
    if origins:
        app.add_middleware(CORSMiddleware, allow_origins=origins, allow_credentials=False,
                           allow_methods=["GET", "POST", "OPTIONS"],
                           allow_headers=["Authorization", "Content-Type"], expose_headers=["Location", "Retry-After"],
                           max_age=600)
    app.add_middleware(SecurityHeadersMiddleware)

"""RFC 9457 problem details: the error format of every API answer that is not a success.

A problem is ``application/problem+json`` with ``type``, ``title``, ``status``, ``detail`` and
``instance``; validation problems add ``errors``: ``[{"loc": [...], "pointer": "#/a/b", "field": "a.b",
"message", "type"}]`` naming the failing field of the request body (or path / query).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from parplan.service.db_errors import unavailable_reason

log = logging.getLogger("parplan.service")

PROBLEM_JSON = "application/problem+json"
TYPE_BASE = "https://parplan.dev/problems/"

_TITLES = {400: "Bad Request", 401: "UnauthorizedError", 403: "ForbiddenError", 404: "Not Found",
           405: "Method Not Allowed", 409: "ConflictError", 413: "Content Too Large", 415: "Unsupported Media Type",
           422: "Unprocessable Content", 429: "Too Many Requests", 500: "Internal Server Error",
           503: "Service Unavailable"}


def problem_response(status: int, detail: str, *, type_: str | None = None, title: str | None = None,
                     instance: str | None = None, headers: dict[str, str] | None = None,
                     **extra: Any) -> Response:
    body: dict[str, Any] = {"type": TYPE_BASE + type_ if type_ else "about:blank",
                            "title": title or _TITLES.get(status, "Error"), "status": status, "detail": detail}
    if instance:
        body["instance"] = instance
    body.update(extra)
    return Response(json.dumps(body, default=str), status_code=status, media_type=PROBLEM_JSON, headers=headers)


class ProblemError(Exception):
    """Raise anywhere in a request to answer with a problem document."""

    status = 400
    type_: str | None = None
    title: str | None = None

    def __init__(self, detail: str, *, status: int | None = None, type_: str | None = None,
                 headers: dict[str, str] | None = None, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        if status is not None:
            self.status = status
        if type_ is not None:
            self.type_ = type_
        self.headers = headers
        self.extra = extra


class NotFoundError(ProblemError):
    status = 404
    type_ = "not-found"


class ConflictError(ProblemError):
    status = 409
    type_ = "conflict"


class UnauthorizedError(ProblemError):
    status = 401
    type_ = "unauthorized"

    def __init__(self, detail: str) -> None:
        super().__init__(detail, headers={"WWW-Authenticate": 'Bearer realm="parplan"'})


class ForbiddenError(ProblemError):
    status = 403
    type_ = "forbidden"


class TooLargeError(ProblemError):
    status = 413
    type_ = "too-large"


def field_error(loc: Sequence[str | int], message: str, type_: str = "invalid") -> dict[str, Any]:
    """One entry of a validation problem's ``errors``; ``loc`` starts with body, path, query or header."""
    parts = [str(p) for p in loc]
    inner = parts[1:] if parts and parts[0] in ("body", "path", "query", "header") else parts
    return {"loc": list(loc), "field": ".".join(inner) or (parts[0] if parts else ""),
            "pointer": "#/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in inner),
            "message": message, "type": type_}


class InvalidError(ProblemError):
    """A request that is well-formed but wrong: 422 with the failing fields."""

    status = 422
    type_ = "validation"

    def __init__(self, detail: str, errors: list[dict[str, Any]], **extra: Any) -> None:
        super().__init__(detail, errors=errors, **extra)


def _clean_loc(loc: Sequence[Any]) -> list[str | int]:
    return [p if isinstance(p, int) else str(p) for p in loc]


async def _on_problem(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ProblemError)
    return problem_response(exc.status, exc.detail, type_=exc.type_, title=exc.title, instance=request.url.path,
                            headers=exc.headers, **exc.extra)


async def _on_validation(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    errs = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in errs):
        ctx = next(e for e in errs if e.get("type") == "json_invalid").get("ctx") or {}
        return problem_response(400, f"the request body is not valid JSON: {ctx.get('error', 'malformed')}",
                                type_="malformed-json", instance=request.url.path)
    errors = [field_error(_clean_loc(e.get("loc", ())), str(e.get("msg", "invalid")), str(e.get("type", "invalid")))
              for e in errs[:50]]
    first = errors[0] if errors else None
    detail = f"{first['field']}: {first['message']}" if first else "invalid request"
    return problem_response(422, detail, type_="validation", instance=request.url.path, errors=errors)


async def _on_http(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    return problem_response(exc.status_code, str(exc.detail), instance=request.url.path,
                            headers=dict(exc.headers) if exc.headers else None)


async def _on_unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return problem_response(500, "internal error; the server log has the details", type_="internal",
                            instance=request.url.path)


#: Retry-After of a 503 for an unavailable database when the app has no settings (seconds).
DATABASE_RETRY_AFTER_SECONDS = 5


async def _on_database(request: Request, exc: Exception) -> Response:
    """503 with Retry-After when the database cannot serve now (see :mod:`parplan.service.db_errors`),
    else the 500 of any unexpected error. One warning line, no traceback: an outage is not a bug."""
    reason = unavailable_reason(exc)
    if reason is None:
        return await _on_unexpected(request, exc)
    runtime = getattr(request.app.state, "runtime", None)
    retry = runtime.settings.retry_after_seconds if runtime is not None else DATABASE_RETRY_AFTER_SECONDS
    log.warning("database unavailable on %s %s: %s", request.method, request.url.path, reason)
    return problem_response(503, f"the database is unavailable: {reason}; retry in {retry} s",
                            type_="database-unavailable", instance=request.url.path,
                            headers={"Retry-After": str(retry)})


def install(app: FastAPI) -> None:
    app.add_exception_handler(ProblemError, _on_problem)
    app.add_exception_handler(SQLAlchemyError, _on_database)
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(StarletteHTTPException, _on_http)
    app.add_exception_handler(Exception, _on_unexpected)


def parse_id(text: str, what: str) -> uuid.UUID:
    """A resource id from a path; one that is not a UUID names no resource (404)."""
    try:
        return uuid.UUID(text)
    except ValueError:
        raise NotFoundError(f"no {what} {text!r}") from None


T = TypeVar("T")


def get_or_404(get: Callable[[uuid.UUID], T | None], text: str, what: str) -> T:
    """The resource ``get`` finds for the id ``text`` (a path segment); NotFoundError if none."""
    found = get(parse_id(text, what))
    if found is None:
        raise NotFoundError(f"no {what} {text}")
    return found

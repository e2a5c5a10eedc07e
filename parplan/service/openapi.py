"""The OpenAPI document, made to say what the service really answers.

FastAPI's own document lists only the statuses a route declares and describes errors as its
``HTTPValidationError``. Every error this service sends is an RFC 9457 ``application/problem+json``
document, and every route can answer a few statuses no route declares (a missing token, a body over
the limit, a rate limit). :func:`install` replaces ``app.openapi`` with a function that builds
FastAPI's document once and then, for every operation:

- declares each error status the operation can answer (401/403/429 behind auth, 400/413 with a
  body, 422 with parameters or a body, 404 with an id in the path, 503 where the queue can be full or the database
  unavailable) with the ``Problem`` schema under ``application/problem+json``, and ``WWW-Authenticate`` or
  ``Retry-After`` where they are sent;
- gives id path parameters the UUID pattern (any other string names no resource: 404);
- writes the limits that come from settings (``cluster.gpus``, ``time_limit``) into the schemas.

It also answers 405 with an ``Allow`` header that lists the methods the document gives the path
(Starlette's lists those of the first route whose path matches, which may be another resource's).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from starlette.exceptions import HTTPException
from starlette.responses import Response

from parplan.service.problems import PROBLEM_JSON, problem_response
from parplan.service.settings import Settings

UUID_PATTERN = "^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$"

PROBLEM_SCHEMA: dict[str, Any] = {
    "title": "Problem",
    "description": "RFC 9457 problem details. Validation problems add `errors`, one entry per failing field.",
    "type": "object",
    "required": ["type", "title", "status", "detail"],
    "properties": {
        "type": {"type": "string", "description": "A URI naming the kind of problem, or about:blank."},
        "title": {"type": "string"},
        "status": {"type": "integer", "minimum": 400, "maximum": 599},
        "detail": {"type": "string"},
        "instance": {"type": "string", "description": "The request path."},
        "errors": {"type": "array", "items": {"$ref": "#/components/schemas/ProblemFieldError"}},
    },
    "additionalProperties": True,
}

FIELD_ERROR_SCHEMA: dict[str, Any] = {
    "title": "ProblemFieldError",
    "type": "object",
    "required": ["loc", "field", "pointer", "message", "type"],
    "properties": {
        "loc": {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "integer"}]}},
        "field": {"type": "string"},
        "pointer": {"type": "string", "description": "JSON pointer into the body, e.g. #/cluster/gpus."},
        "message": {"type": "string"},
        "type": {"type": "string"},
    },
    "additionalProperties": True,
}

_DESCRIPTIONS = {
    400: "Malformed request (the body is not JSON)",
    401: "No valid bearer token",
    403: "The token lacks the scope",
    404: "No such resource",
    405: "Method not allowed",
    409: "Conflict with the resource's state",
    413: "Request body or model graph over the limit",
    422: "Invalid request: `errors` names each failing field",
    429: "Rate limit or concurrent-job limit of the token reached; retry after `Retry-After` seconds",
    503: "Overloaded, or the database is unavailable; retry after `Retry-After` seconds",
}

_HEADERS: dict[int, dict[str, Any]] = {
    401: {"WWW-Authenticate": {"description": "Bearer realm", "schema": {"type": "string"}}},
    429: {"Retry-After": {"description": "Seconds to wait", "schema": {"type": "integer", "minimum": 0}}},
    503: {"Retry-After": {"description": "Seconds to wait", "schema": {"type": "integer", "minimum": 0}}},
}

#: Operations whose answer may be 503 because the job queue is full.
_QUEUEING = {("post", "/v1/plans")}
_UNAUTHENTICATED = {"/healthz", "/readyz", "/metrics"}
#: Paths that never read the database (every other one answers 503 while it is unavailable).
_NO_DATABASE = {"/healthz", "/metrics"}


def _problem_response(status: int, description: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"description": description or _DESCRIPTIONS.get(status, "Problem"),
                           "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}}
    if status in _HEADERS:
        out["headers"] = _HEADERS[status]
    return out


def _error_statuses(method: str, path: str, op: dict[str, Any]) -> set[int]:
    statuses: set[int] = set()
    authenticated = path not in _UNAUTHENTICATED
    if authenticated:
        statuses |= {401, 403, 429}
    if "requestBody" in op:
        statuses |= {400, 413, 422}
    if op.get("parameters"):
        statuses.add(422)
    if "requestBody" in op or any(p.get("in") == "path" for p in op.get("parameters", [])):
        statuses.add(404)  # an id in the path or the body (agent_id) that names nothing
    if (method, path) in _QUEUEING or path not in _NO_DATABASE:
        statuses.add(503)
    return statuses


def _fix_operation(method: str, path: str, op: dict[str, Any]) -> None:
    responses: dict[str, Any] = op.setdefault("responses", {})
    for code, resp in list(responses.items()):
        if code.isdigit() and int(code) >= 400:
            # Keep the route's own words, but every error is a problem document.
            desc = resp.get("description")
            responses[code] = _problem_response(int(code), None if desc in (None, "RFC 9457 problem",
                                                                             "Validation Error") else desc)
    for status in _error_statuses(method, path, op):
        responses.setdefault(str(status), _problem_response(status))
    for param in op.get("parameters", []):
        if param.get("in") == "path" and param["name"].endswith("_id"):
            param["schema"] = {**param.get("schema", {}), "type": "string", "pattern": UUID_PATTERN}


def _set_limits(schemas: dict[str, Any], settings: Settings) -> None:
    gpus = schemas.get("ClusterSpec", {}).get("properties", {}).get("gpus")
    if gpus is not None:
        gpus["maximum"] = settings.max_devices
    wait = schemas.get("ClaimIn", {}).get("properties", {}).get("wait_seconds")
    if wait is not None:
        wait["maximum"] = settings.max_claim_wait_seconds
    time_limit = schemas.get("PlanRequestIn", {}).get("properties", {}).get("time_limit")
    if time_limit is not None:
        for branch in time_limit.get("anyOf", [time_limit]):
            if branch.get("type") == "number":
                branch["maximum"] = settings.max_time_limit_seconds


def build(app: FastAPI, settings: Settings) -> dict[str, Any]:
    """The document for ``app`` with the corrections above."""
    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    schemas: dict[str, Any] = doc.setdefault("components", {}).setdefault("schemas", {})
    for method_map_path, item in doc.get("paths", {}).items():
        for method, op in item.items():
            if method in ("get", "post", "put", "patch", "delete"):
                _fix_operation(method, method_map_path, op)
    schemas.pop("HTTPValidationError", None)
    schemas.pop("ValidationError", None)
    schemas["Problem"] = PROBLEM_SCHEMA
    schemas["ProblemFieldError"] = FIELD_ERROR_SCHEMA
    _set_limits(schemas, settings)
    # the job long poll's bound is a setting too
    job = doc.get("paths", {}).get("/v1/jobs/{job_id}", {}).get("get", {})
    for param in job.get("parameters", []):
        if param.get("name") == "wait":
            for branch in param.get("schema", {}).get("anyOf", [param.get("schema", {})]):
                if branch.get("type") == "number":
                    branch["maximum"] = settings.max_job_wait_seconds
    return doc


_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


def allowed_methods(doc: dict[str, Any], path: str) -> list[str]:
    """The methods ``doc`` gives ``path``: those of the matching template with the fewest
    parameters (``/v1/validations/claim`` is not ``/v1/validations/{validation_id}``)."""
    best: tuple[int, set[str]] | None = None
    for template, item in doc.get("paths", {}).items():
        regex = "^" + re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template)) + "$"
        if not re.match(regex, path):
            continue
        params = template.count("{")
        methods = {m.upper() for m in item if m in _METHODS}
        if best is None or params < best[0]:
            best = (params, methods)
        elif params == best[0]:
            best[1].update(methods)
    return sorted(best[1]) if best else []


def install(app: FastAPI, settings: Settings) -> None:
    """Serve :func:`build`'s document (built on first use) at ``app.openapi_url``, and answer 405
    with the path's methods in ``Allow``."""
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build(app, settings)
        return app.openapi_schema

    async def method_not_allowed(request: Request, exc: Exception) -> Response:
        allow = allowed_methods(openapi(), request.url.path)
        if not allow and isinstance(exc, HTTPException) and exc.headers:
            allow = [exc.headers.get("Allow", "")]
        return problem_response(405, f"{request.method} is not allowed here; allowed: {', '.join(allow)}",
                                instance=request.url.path, headers={"Allow": ", ".join(allow)})

    setter: Callable[[], dict[str, Any]] = openapi
    app.openapi = setter  # type: ignore[method-assign]
    app.add_exception_handler(405, method_not_allowed)

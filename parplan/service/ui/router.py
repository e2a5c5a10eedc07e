"""``/ui`` pages and their static files. A page is a shell with no data in it (so it needs no
token); its script reads the ``/v1`` API with the token the user gave, sent as a header."""

from __future__ import annotations

import html
from functools import lru_cache
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from parplan.service.problems import NotFoundError, parse_id

router = APIRouter(prefix="/ui", include_in_schema=False)

#: What the dashboard's pages may load: only this server's own scripts, styles and API.
CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                           "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
SECURITY_HEADERS = {"Content-Security-Policy": CONTENT_SECURITY_POLICY, "X-Content-Type-Options": "nosniff",
                    "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}
_MEDIA_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
                ".svg": "image/svg+xml"}

_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} · parplan</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="/ui/static/ui.css">
<script src="/ui/static/ui.js" defer></script>
{charts}<script src="/ui/static/{script}.js" defer></script>
</head>
<body data-page="{script}" data-id="{ident}">
<header class="top">
  <a class="brand" href="/ui">parplan</a>
  <nav><a href="/ui">Jobs</a> <a href="/ui/new">New plan</a> <a href="/docs">API</a></nav>
  <span id="who" class="who"></span>
</header>
<main>
<h1 id="title">{title}</h1>
<form id="auth" class="auth" hidden>
  <p>This server needs a token (<code>parplan token create --scope plans:read</code>). It is kept in this
  tab only (sessionStorage) and sent as an <code>Authorization</code> header.</p>
  <label>Token <input id="auth-token" type="password" autocomplete="off" required></label>
  <button type="submit">Use token</button>
  <span id="auth-error" class="field-error"></span>
</form>
<div id="status" class="status" role="status"></div>
<div id="content"></div>
</main>
</body>
</html>
"""


#: What a page with charts loads after ui.js and before its own script: uPlot (vendored, see its README) and charts.js.
_CHARTS = """<link rel="stylesheet" href="/ui/static/vendor/uplot/uPlot.min.css">
<script src="/ui/static/vendor/uplot/uPlot.iife.min.js" defer></script>
<script src="/ui/static/charts.js" defer></script>
"""


#: The page for an id that names nothing: the dashboard's frame and a way back, no script.
_NOT_FOUND = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Not found · parplan</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="/ui/static/ui.css">
</head>
<body>
<header class="top">
  <a class="brand" href="/ui">parplan</a>
  <nav><a href="/ui">Jobs</a> <a href="/ui/new">New plan</a> <a href="/docs">API</a></nav>
</header>
<main>
<h1>Not found</h1>
<p class="status">{message}</p>
<p><a href="/ui">Back to the jobs</a></p>
</main>
</body>
</html>
"""


def page(title: str, script: str, ident: str = "", charts: bool = False) -> HTMLResponse:
    body = _PAGE.format(title=html.escape(title), script=script, ident=html.escape(ident),
                        charts=_CHARTS if charts else "")
    return HTMLResponse(body, headers=SECURITY_HEADERS)


def resource_page(title: str, script: str, text: str, what: str, charts: bool = False) -> HTMLResponse:
    """The page of one resource; for an id that is not one (not a UUID), the not-found page (404)."""
    try:
        ident = parse_id(text, what)
    except NotFoundError:
        message = html.escape(f"There is no {what} {text!r}: {what} ids are UUIDs, as the API gives them.")
        return HTMLResponse(_NOT_FOUND.format(message=message), status_code=404, headers=SECURITY_HEADERS)
    return page(title, script, str(ident), charts)


@lru_cache(maxsize=128)
def _static(name: str) -> bytes | None:
    """A file under static/ (a path such as ``vendor/uplot/uPlot.min.css``); None for a name that is not
    one, or that tries to leave the folder (an empty or dot-led part)."""
    parts = name.split("/")
    if any(not p or p.startswith(".") or "\\" in p for p in parts):
        return None
    path = resources.files("parplan.service.ui").joinpath("static", *parts)
    return path.read_bytes() if path.is_file() else None


@router.get("", response_class=HTMLResponse)
async def jobs_page() -> HTMLResponse:
    return page("Jobs", "jobs")


@router.get("/", response_class=RedirectResponse)
async def jobs_page_slash() -> RedirectResponse:
    return RedirectResponse("/ui", status_code=308)


@router.get("/new", response_class=HTMLResponse)
async def new_plan_page() -> HTMLResponse:
    return page("New plan", "new")


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
async def job_page(job_id: str) -> HTMLResponse:
    return resource_page("Job", "job", job_id, "job")


@router.get("/plans/{plan_id}", response_class=HTMLResponse)
async def plan_page(plan_id: str) -> HTMLResponse:
    return resource_page("Plan", "plan", plan_id, "plan", charts=True)


@router.get("/capacity/{sweep_id}", response_class=HTMLResponse)
async def capacity_page(sweep_id: str) -> HTMLResponse:
    return resource_page("Capacity sweep", "capacity", sweep_id, "capacity sweep", charts=True)


@router.get("/validations/{validation_id}", response_class=HTMLResponse)
async def validation_page(validation_id: str) -> HTMLResponse:
    return resource_page("Validation", "validation", validation_id, "validation")


@router.get("/static/{name:path}")
async def static_file(name: str) -> Response:
    """The dashboard's scripts and style sheets, its own and the vendored chart library (package data)."""
    suffix = name[name.rfind("."):] if "." in name else ""
    data = _static(name) if suffix in _MEDIA_TYPES else None
    if data is None:
        raise NotFoundError(f"no file {name!r}")
    headers = {"X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}
    return Response(data, media_type=_MEDIA_TYPES[suffix], headers=headers)

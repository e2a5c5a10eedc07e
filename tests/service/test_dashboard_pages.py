"""The dashboard's server side: page shells with security headers and no data in them, their
static files (package data, no CDN), ``/v1/whoami`` and the jobs list's request summaries.
What the pages do in a browser is tests/ui."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from parplan.service.database import utcnow
from parplan.service.models import Job, JobStatus

Headers = dict[str, str]
STATIC = Path(__file__).parents[2] / "parplan" / "service" / "ui" / "static"
PAGES = ["/ui", "/ui/new", f"/ui/jobs/{uuid.uuid4()}", f"/ui/plans/{uuid.uuid4()}",
         f"/ui/validations/{uuid.uuid4()}", f"/ui/capacity/{uuid.uuid4()}"]


@pytest.mark.parametrize("path", PAGES)
def test_pages_are_shells_with_security_headers(client: TestClient, path: str) -> None:
    r = client.get(path)  # no token: a page holds no data; its script asks for a token if needed
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
    assert r.headers["x-content-type-options"] == "nosniff" and r.headers["x-frame-options"] == "DENY"
    assert r.headers["referrer-policy"] == "no-referrer"
    html = r.text
    assert "<script>" not in html and " style=" not in html and "http://" not in html and "https://" not in html
    for src in re.findall(r'(?:src|href)="(/ui/static/[^"]+)"', html):
        asset = client.get(src)
        assert asset.status_code == 200 and asset.headers["x-content-type-options"] == "nosniff", src


def test_every_static_file_is_served_and_loads_nothing_from_elsewhere(client: TestClient) -> None:
    names = sorted(p.relative_to(STATIC).as_posix() for p in STATIC.rglob("*") if p.suffix in (".js", ".css"))
    assert {"ui.js", "ui.css", "jobs.js", "new.js", "job.js", "plan.js", "validation.js", "charts.js", "capacity.js",
            "vendor/uplot/uPlot.iife.min.js", "vendor/uplot/uPlot.min.css"} <= set(names)
    for name in names:
        r = client.get(f"/ui/static/{name}")
        assert r.status_code == 200 and r.content == (STATIC / name).read_bytes()
        assert "innerHTML" not in r.text and "eval(" not in r.text and "//cdn" not in r.text
        assert "localStorage" not in r.text  # the token lives in sessionStorage only
    assert client.get("/ui/static/ui.js").headers["content-type"].startswith("text/javascript")


@pytest.mark.parametrize("path", ["/ui/static/nope.js", "/ui/static/..%2Fapp.py", "/ui/static/router.py",
                                  "/ui/static/vendor/..%2F..%2Frouter.py", "/ui/static/vendor/uplot/LICENSE",
                                  "/ui/static/vendor//uplot/uPlot.min.css", "/ui/static/vendor/uplot/.x.js"])
def test_unknown_pages_and_files_are_problems(client: TestClient, path: str) -> None:
    r = client.get(path)
    assert r.status_code == 404 and r.headers["content-type"] == "application/problem+json"


@pytest.mark.parametrize("path", ["/ui/jobs/not-a-uuid", "/ui/plans/not-a-uuid", "/ui/plans/1", "/ui/capacity/x",
                                  "/ui/validations/%3Cb%3E"])
def test_a_bad_id_gets_the_dashboards_not_found_page(client: TestClient, path: str) -> None:
    r = client.get(path)
    assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
    assert r.headers["content-security-policy"] == client.get("/ui").headers["content-security-policy"]
    assert "<h1>Not found</h1>" in r.text and 'href="/ui"' in r.text and "<b>" not in r.text


def test_the_page_id_is_the_parsed_uuid(client: TestClient) -> None:
    ident = uuid.uuid4()
    assert f'data-id="{ident}"' in client.get(f"/ui/jobs/{str(ident).upper()}").text


def test_whoami_names_the_token_and_its_scopes(client: TestClient, writer: Headers, agent: Headers) -> None:
    me = client.get("/v1/whoami", headers=writer).json()
    assert me == {"name": "test", "scopes": ["plans:read", "plans:write"], "auth_required": True}
    assert client.get("/v1/whoami", headers=agent).json()["scopes"] == ["agent"]
    assert client.get("/v1/whoami").status_code == 401


def test_the_job_list_summarises_each_request(client: TestClient, reader: Headers,
                                              db: sessionmaker[Session]) -> None:
    now = utcnow()
    requests = [({"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": 8, "gpu": "H100-80GB"},
                  "objective": {"kind": "max-throughput"}, "target": "megatron", "search": "dp"}, JobStatus.QUEUED),
                ({"model": {"hf_config": {"model_type": "llama", "hidden_size": 64}}, "cluster": {"gpus": 2}},
                 JobStatus.FAILED),
                ({"model": {"graph": {"nodes": []}}, "cluster": {"gpus": 4}}, JobStatus.QUEUED)]
    with db() as s:
        for i, (req, status) in enumerate(requests):
            s.add(Job(status=status.value, request=req, request_hash=f"s{i}", cache_key=f"s{i}",
                      progress_stage="queued", progress_fraction=0.0, attempts=0, created_at=now, updated_at=now))
        s.commit()
    jobs = client.get("/v1/jobs", headers=reader).json()["jobs"]
    by_model = {j["request_summary"]["model"]: j["request_summary"] for j in jobs}
    assert by_model["gpt-1.7b"] == {"model": "gpt-1.7b", "gpus": 8, "gpu": "H100-80GB", "objective": "max-throughput",
                                    "target": "megatron", "search": "dp", "solve_seconds": None, "cached": False}
    assert by_model["hf:llama"]["gpus"] == 2 and by_model["hf:llama"]["objective"] == "min-memory"
    assert by_model["graph"]["gpus"] == 4 and by_model["graph"]["target"] == "any"

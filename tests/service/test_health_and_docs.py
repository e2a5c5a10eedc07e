"""/healthz, /readyz (database and broker), /metrics (Prometheus), OpenAPI and the catalogues."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from parplan.service.app import create_app
from parplan.service.runtime import Runtime
from parplan.service.settings import Settings
from parplan.solver.cluster import GPU_PRESETS
from parplan.solver.frontends.presets import PRESETS
from parplan.workers.celery_app import CeleryJobQueue

Headers = dict[str, str]


def test_healthz_and_readyz(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"] == {"database": "ok", "broker": "ok", "queue": "celery"}


def test_readyz_is_503_when_the_broker_is_unreachable(settings: Settings, db: sessionmaker[Session]) -> None:
    broken = settings.model_copy(update={"broker_url": "redis://127.0.0.1:1/0"})
    rt = Runtime(settings=broken, session_factory=db, queue=CeleryJobQueue(broken), run_sweeper=False)
    with TestClient(create_app(runtime=rt)) as c:
        r = c.get("/readyz")
        assert r.status_code == 503 and r.headers["content-type"] == "application/problem+json"
        assert r.json()["checks"]["broker"] == "unreachable" and r.json()["checks"]["database"] == "ok"
        assert c.get("/healthz").status_code == 200


def test_a_submission_while_the_broker_is_down_still_commits_the_job(settings: Settings, db: sessionmaker[Session],
                                                                     writer: Headers) -> None:
    broken = settings.model_copy(update={"broker_url": "redis://127.0.0.1:1/0"})
    rt = Runtime(settings=broken, session_factory=db, queue=CeleryJobQueue(broken), run_sweeper=False)
    with TestClient(create_app(runtime=rt)) as c:
        r = c.post("/v1/plans", json={"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": 8}}, headers=writer)
        assert r.status_code == 202  # the sweeper enqueues it once the broker is back
        assert c.get(r.headers["location"], headers=writer).json()["job"]["status"] == "queued"


def test_metrics(client: TestClient, writer: Headers) -> None:
    client.post("/v1/plans", json={"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": 8}}, headers=writer)
    client.get("/v1/jobs/not-a-job", headers=writer)
    text = client.get("/metrics").text
    assert 'parplan_http_requests_total{method="POST",route="/v1/plans",status="202"} 1.0' in text
    assert 'parplan_http_requests_total{method="GET",route="/v1/jobs/{job_id}",status="404"} 1.0' in text
    assert "parplan_http_request_duration_seconds_bucket" in text
    assert 'parplan_jobs{status="queued"} 1.0' in text and 'parplan_jobs{status="running"} 0.0' in text
    assert "parplan_queue_depth 1.0" in text
    assert 'parplan_solve_seconds_bucket{le="+Inf"} 0.0' in text and "parplan_solve_seconds_count 0.0" in text


def test_openapi_documents_the_api(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    paths = spec["paths"]
    for p in ("/v1/plans", "/v1/plans/{plan_id}", "/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/cancel",
              "/v1/models", "/v1/clusters/presets", "/v1/agents/register", "/v1/agents/{agent_id}/heartbeat",
              "/v1/plans/{plan_id}/validations", "/v1/validations/{validation_id}", "/v1/validations/claim",
              "/v1/validations/{validation_id}/result", "/v1/profiles", "/healthz", "/readyz", "/metrics"):
        assert p in paths, p
    body = spec["components"]["schemas"]["PlanRequestIn"]
    assert set(body["required"]) == {"model", "cluster"}
    assert "bearer" in str(spec["components"]["securitySchemes"]).lower()
    assert "text/html" in client.get("/docs").headers["content-type"]


def test_catalogues(client: TestClient, reader: Headers) -> None:
    models = client.get("/v1/models", headers=reader).json()["models"]
    assert [m["name"] for m in models] == list(PRESETS)
    gpt = next(m for m in models if m["name"] == "gpt-1.7b")
    assert gpt["layers"] == 24 and gpt["hidden"] == 2304 and 1.5e9 < gpt["parameters"] < 2e9
    gpus = client.get("/v1/clusters/presets", headers=reader).json()["gpus"]
    assert [g["name"] for g in gpus] == list(GPU_PRESETS)
    a100 = next(g for g in gpus if g["name"] == "A100-80GB")
    assert a100["memory_bytes"] == 80 * 2**30 and a100["intra_node"]["bandwidth_bytes_per_s"] > 0

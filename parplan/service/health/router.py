"""``/healthz`` (the process is up), ``/readyz`` (database reachable and writable, broker reachable), ``/metrics``."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from parplan.service.db_errors import unavailable_reason
from parplan.service.deps import RuntimeDep
from parplan.service.problems import problem_response

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> JSONResponse:
    return JSONResponse({"status": "ok"})


@router.get("/readyz", responses={503: {"description": "A dependency is unreachable (problem+json)"}})
def readyz(rt: RuntimeDep) -> Response:
    checks: dict[str, str] = {}
    try:
        with rt.session_factory() as s:
            s.execute(text("SELECT 1"))
            # and writable: a write that changes nothing, rolled back. A database that answers
            # reads but refuses writes (a read-only SQLite file, a standby) would refuse every job.
            s.execute(text("UPDATE alembic_version SET version_num = version_num"))
            s.rollback()
        checks["database"] = "ok"
    except Exception as e:
        checks["database"] = unavailable_reason(e) or f"unreachable: {e.__class__.__name__}"
    checks["broker"] = "ok" if rt.queue.ping() else "unreachable"
    checks["queue"] = rt.queue.kind
    if all(v == "ok" for k, v in checks.items() if k != "queue"):
        return JSONResponse({"status": "ready", "checks": checks})
    return problem_response(503, "not ready: " + ", ".join(f"{k} {v}" for k, v in checks.items() if v != "ok"
                                                            and k != "queue"),
                            type_="not-ready", checks=checks)


@router.get("/metrics", response_class=Response)
def metrics(rt: RuntimeDep) -> Response:
    assert rt.metrics is not None
    return Response(generate_latest(rt.metrics.registry), media_type=CONTENT_TYPE_LATEST)

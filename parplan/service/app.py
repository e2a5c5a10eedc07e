"""The FastAPI application: ``create_app(settings, queue_factory=...)``. The service does not know its
workers: :mod:`parplan.server` passes their queue factory (``uvicorn --factory parplan.server:create_app``)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI

from parplan import __version__ as package_version
from parplan.service import openapi, problems, redaction, security
from parplan.service.agents.router import router as agents_router
from parplan.service.auth.router import router as auth_router
from parplan.service.capacity.router import router as capacity_router
from parplan.service.catalog.router import router as catalog_router
from parplan.service.evaluations.router import router as evaluations_router
from parplan.service.health.metrics import Metrics, MetricsMiddleware
from parplan.service.health.router import router as health_router
from parplan.service.jobs.router import router as jobs_router
from parplan.service.json_text import check_json_text
from parplan.service.limits import BodyLimitMiddleware
from parplan.service.plans.router import router as plans_router
from parplan.service.profiles.router import router as profiles_router
from parplan.service.queue import QueueFactory
from parplan.service.runtime import Runtime
from parplan.service.settings import Settings
from parplan.service.ui.router import router as ui_router
from parplan.service.validations.router import router as validations_router
from parplan.solver import SOLVER_VERSION

log = logging.getLogger("parplan.service")

DESCRIPTION = """Parallelism plans for training large models.

`POST /v1/plans` answers `202` with a job to poll (`GET /v1/jobs/{id}`), or `200` with the plan
when the same request was solved before. Errors are RFC 9457 `application/problem+json`.
Strings in request bodies are Unicode text: NUL (`\\u0000`) and lone surrogates are refused (422).
Authenticate with `Authorization: Bearer <token>` (`parplan token create --scope ...`).
Follow a job with `GET /v1/jobs/{id}/events` (Server-Sent Events) or `GET /v1/jobs/{id}?wait=30`
(long poll). People use the dashboard at `/ui`."""


def create_app(settings: Settings | None = None, *, runtime: Runtime | None = None,
               queue_factory: QueueFactory | None = None) -> FastAPI:
    """The app, with a runtime built from ``settings`` whose jobs go to the queue ``queue_factory``
    builds, or the given ``runtime`` (tests); it is started and stopped with the app's lifespan."""
    settings = settings or (runtime.settings if runtime else Settings())
    redaction.install()
    if runtime is not None:
        rt = runtime
    elif queue_factory is not None:
        rt = Runtime.create(settings, queue_factory)
    else:
        raise ValueError("create_app needs a runtime or a queue factory (parplan.server.create_app passes the "
                         "workers')")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        rt.start()
        try:
            yield
        finally:
            rt.stop()

    app = FastAPI(title="parplan", version=package_version, description=DESCRIPTION, lifespan=lifespan,
                  openapi_url="/openapi.json", docs_url="/docs", redoc_url=None,
                  dependencies=[Depends(check_json_text)])
    app.state.runtime = rt
    app.state.solver_version = SOLVER_VERSION
    problems.install(app)
    openapi.install(app, settings)
    for r in (plans_router, jobs_router, validations_router, agents_router, profiles_router, catalog_router,
              evaluations_router, health_router, auth_router, ui_router, capacity_router):
        app.include_router(r)

    def current_metrics() -> Metrics | None:
        return rt.metrics

    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(MetricsMiddleware, metrics=current_metrics)
    security.install(app, settings)
    return app

"""The composition root: the one module that joins the service to its workers. It builds the app
with the workers' queue factory (``uvicorn --factory parplan.server:create_app``) and holds the
``serve`` and ``worker`` commands. The service never imports :mod:`parplan.workers` (a test checks
it); the workers import the service."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING

from parplan.cli_args import UsageError
from parplan.service.command_env import describe, settings_from_env, store, upgrade_schema

if TYPE_CHECKING:
    from fastapi import FastAPI

    from parplan.service.settings import Settings


def create_app(settings: Settings | None = None) -> FastAPI:
    """The service's app whose jobs run on the workers (Celery, or the in-process executor)."""
    from parplan.service.app import create_app as create_service_app
    from parplan.workers.factory import make_queue

    return create_service_app(settings, queue_factory=make_queue)


def cmd_serve(args: argparse.Namespace) -> int:
    from parplan.service.settings import AuthMode

    settings = settings_from_env(host=args.host, port=args.port)
    if settings.auth is AuthMode.DISABLED and not settings.loopback:
        raise UsageError(f"PARPLAN_AUTH=disabled is allowed only on a loopback address, not {settings.host}; "
                         "create tokens with `parplan token create` instead")
    migrate = args.migrate if args.migrate is not None else settings.embedded
    if migrate:
        try:
            upgrade_schema(settings)
        except Exception as e:
            from parplan.service.db_errors import unavailable_reason

            reason = unavailable_reason(e)
            if reason is None:
                raise
            print(f"parplan serve: error: cannot bring the schema of the database {store(settings)} up to date: "
                  f"{reason}; check that the database is reachable, and for SQLite that the file and its directory "
                  "are writable and the disk has space", file=sys.stderr)
            return 1
    import uvicorn

    print(f"parplan serve: {describe(settings)}", file=sys.stderr)
    if settings.auth_required:
        print("parplan serve: bearer tokens required (create one: parplan token create --scope plans:write)",
              file=sys.stderr)
    else:
        print(f"parplan serve: authentication is OFF: requests without a token are accepted because the "
              f"server listens on loopback only ({settings.host}); set PARPLAN_AUTH=required to demand tokens",
              file=sys.stderr)
    print(f"parplan serve: listening on http://{settings.host}:{settings.port} (API docs at /docs)",
          file=sys.stderr, flush=True)
    if args.workers > 1:
        # Each process builds its app from the environment.
        os.environ["PARPLAN_HOST"], os.environ["PARPLAN_PORT"] = settings.host, str(settings.port)
        uvicorn.run("parplan.server:create_app", factory=True, host=settings.host, port=settings.port,
                    workers=args.workers, log_level=args.log_level, access_log=args.access_log)
        return 0
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=args.log_level,
                access_log=args.access_log)
    return 0


def cmd_worker(args: argparse.Namespace) -> int:

    settings = settings_from_env()
    if not settings.broker_url:
        raise UsageError("PARPLAN_BROKER_URL is not set: the embedded default runs jobs inside `parplan serve`; "
                         "a worker needs Redis (e.g. PARPLAN_BROKER_URL=redis://127.0.0.1:6379/0)")
    import socket

    from parplan.workers.celery_app import make_celery
    from parplan.workers.tasks import register_tasks

    app = make_celery(settings)
    hostname = args.hostname or f"parplan@{socket.gethostname()}"
    if args.ping:
        replies = app.control.ping(destination=[hostname], timeout=3.0)
        print(json.dumps(replies))
        return 0 if replies else 1
    if settings.embedded:
        print("parplan worker: warning: PARPLAN_DATABASE_URL is not set; this worker uses the SQLite file "
              f"{settings.data_dir / 'parplan.db'}", file=sys.stderr)
    register_tasks(app, settings)
    print(f"parplan worker: {describe(settings)}; queue {settings.queue_name}", file=sys.stderr, flush=True)
    argv = ["worker", f"--loglevel={args.log_level}", f"--concurrency={args.concurrency}",
            f"--queues={settings.queue_name}", f"--hostname={hostname}", "--without-gossip", "--without-mingle",
            "--pool=prefork"]
    app.worker_main(argv)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``serve`` and ``worker`` to ``sub``; each sets ``handler`` with ``set_defaults``."""
    levels = ["critical", "error", "warning", "info", "debug"]

    serve = sub.add_parser("serve", help="run the planning service (HTTP API)",
                           description="Run the HTTP API. With no configuration: SQLite under PARPLAN_DATA_DIR, an "
                           "in-process executor, 127.0.0.1:8000, no tokens needed on loopback. PARPLAN_DATABASE_URL "
                           "and PARPLAN_BROKER_URL switch to PostgreSQL and Celery/Redis (docs/service.md).")
    serve.add_argument("--host", default=None, help="bind address (default PARPLAN_HOST or 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port (default PARPLAN_PORT or 8000)")
    serve.add_argument("--workers", type=int, default=1, help="API processes (default 1)")
    mig = serve.add_mutually_exclusive_group()
    mig.add_argument("--migrate", dest="migrate", action="store_true", default=None,
                     help="run `db upgrade` before serving (default: only for the embedded SQLite file)")
    mig.add_argument("--no-migrate", dest="migrate", action="store_false")
    serve.add_argument("--log-level", choices=levels, default="info")
    serve.add_argument("--access-log", action="store_true", help="log every request")
    serve.set_defaults(handler=cmd_serve)

    worker = sub.add_parser("worker", help="run a Celery worker that solves queued plan jobs",
                            description="Run a Celery worker (needs PARPLAN_BROKER_URL and PARPLAN_DATABASE_URL).")
    worker.add_argument("--concurrency", type=int, default=max(1, os.cpu_count() or 1),
                        help="solves at once (default: CPU count)")
    worker.add_argument("--hostname", default=None, help="Celery node name (default parplan@<host>)")
    worker.add_argument("--log-level", choices=levels, default="info")
    worker.add_argument("--ping", action="store_true", help="ask this host's worker whether it is up (health check)")
    worker.set_defaults(handler=cmd_worker)

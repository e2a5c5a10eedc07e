"""CLI subcommands of the service (``serve``, ``worker``, ``db``, ``token``); registered by
:mod:`parplan.cli`. Heavy imports happen inside the handlers, so the planner CLI stays fast and
works without the service extras."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any


def _settings(**overrides: Any) -> Any:
    from parplan.service.settings import Settings

    return Settings(**{k: v for k, v in overrides.items() if v is not None})


def _store(settings: Any) -> str:
    """The database, for people (no password)."""
    if settings.embedded:
        return f"SQLite {settings.data_dir / 'parplan.db'}"
    from sqlalchemy.engine import make_url

    return str(make_url(settings.resolved_database_url).render_as_string(hide_password=True))


def _describe(settings: Any) -> str:
    store = _store(settings)
    if settings.broker_url:
        from sqlalchemy.engine import make_url

        queue = f"Celery via {make_url(settings.broker_url).render_as_string(hide_password=True)}"
    else:
        queue = f"in-process executor ({settings.executor_workers} solver process(es) at a time)"
    return f"database {store}; jobs: {queue}"


def _upgrade(settings: Any) -> None:
    from parplan.service.migrate import upgrade

    if settings.embedded:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    upgrade(settings.resolved_database_url)


def cmd_serve(args: argparse.Namespace) -> int:
    from parplan.cli import UsageError
    from parplan.service.settings import AuthMode

    settings = _settings(host=args.host, port=args.port)
    if settings.auth is AuthMode.DISABLED and not settings.loopback:
        raise UsageError(f"PARPLAN_AUTH=disabled is allowed only on a loopback address, not {settings.host}; "
                         "create tokens with `parplan token create` instead")
    migrate = args.migrate if args.migrate is not None else settings.embedded
    if migrate:
        try:
            _upgrade(settings)
        except Exception as e:
            from parplan.service.db_errors import unavailable_reason

            reason = unavailable_reason(e)
            if reason is None:
                raise
            print(f"parplan serve: error: cannot bring the schema of the database {_store(settings)} up to date: "
                  f"{reason}; check that the database is reachable, and for SQLite that the file and its directory "
                  "are writable and the disk has space", file=sys.stderr)
            return 1
    import uvicorn

    print(f"parplan serve: {_describe(settings)}", file=sys.stderr)
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
        uvicorn.run("parplan.service.app:create_app", factory=True, host=settings.host, port=settings.port,
                    workers=args.workers, log_level=args.log_level, access_log=args.access_log)
        return 0
    from parplan.service.app import create_app

    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=args.log_level,
                access_log=args.access_log)
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from parplan.cli import UsageError

    settings = _settings()
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
    print(f"parplan worker: {_describe(settings)}; queue {settings.queue_name}", file=sys.stderr, flush=True)
    argv = ["worker", f"--loglevel={args.log_level}", f"--concurrency={args.concurrency}",
            f"--queues={settings.queue_name}", f"--hostname={hostname}", "--without-gossip", "--without-mingle",
            "--pool=prefork"]
    app.worker_main(argv)
    return 0


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from parplan.service.migrate import upgrade

    settings = _settings()
    if settings.embedded:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    upgrade(settings.resolved_database_url, args.revision)
    print(f"parplan db: upgraded to {args.revision} ({_describe(settings).split(';')[0]})", file=sys.stderr)
    return 0


def cmd_db_current(args: argparse.Namespace) -> int:
    from parplan.service.migrate import current_revision, head_revision

    settings = _settings()
    cur = current_revision(settings.resolved_database_url)
    head = head_revision()
    print(json.dumps({"current": cur, "head": head, "up_to_date": cur == head}))
    return 0 if cur == head else 1


def cmd_token_create(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import OperationalError, ProgrammingError

    from parplan.cli import UsageError
    from parplan.service.auth.service import create_token, parse_scopes
    from parplan.service.token_commands import parse_expires, token_session

    try:
        scopes = parse_scopes(args.scope)
        expires_at = parse_expires(args.expires) if args.expires else None
    except ValueError as e:
        raise UsageError(str(e)) from None
    try:
        with token_session() as session:
            row, secret = create_token(session, args.name, scopes, expires_at)
            session.commit()
    except (OperationalError, ProgrammingError) as e:
        print(f"parplan token: error: cannot store the token ({e.__class__.__name__}); is the database reachable "
              "and upgraded (`parplan db upgrade`)?", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"id": str(row.id), "name": row.name, "scopes": row.scopes, "token": secret,
                          "expires_at": expires_at.isoformat() if expires_at else None}))
    else:
        print(f"parplan token: created {row.name!r} ({', '.join(row.scopes)}); it is shown only once:",
              file=sys.stderr)
        print(secret)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the service's subcommands to ``sub``; each sets ``handler`` with ``set_defaults``."""
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

    db = sub.add_parser("db", help="database schema migrations")
    db_sub = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    up = db_sub.add_parser("upgrade", help="migrate the schema (alembic upgrade)")
    up.add_argument("--revision", default="head", help="target revision (default head)")
    up.set_defaults(handler=cmd_db_upgrade)
    cur = db_sub.add_parser("current", help="print the schema revision; exit 1 when not at head")
    cur.set_defaults(handler=cmd_db_current)

    token = sub.add_parser("token", help="API tokens")
    token_sub = token.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    create = token_sub.add_parser("create", help="create a bearer token (printed once; stored hashed)")
    create.add_argument("--scope", action="append", required=True,
                        help="plans:write, plans:read, agent or admin (repeat, or separate with commas)")
    create.add_argument("--name", default="token", help="a label for the token")
    create.add_argument("--expires", default=None, metavar="WHEN",
                        help="stop working after a duration (30d, 12h, 90m) or at an ISO date (default: never)")
    create.add_argument("--json", action="store_true", help="print one JSON document")
    create.set_defaults(handler=cmd_token_create)
    from parplan.service.token_commands import register as register_token_admin

    register_token_admin(token_sub)

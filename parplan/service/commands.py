"""CLI subcommands of the service (``db``, ``token``), registered by :mod:`parplan.cli` (``serve``
and ``worker`` join the service to its workers: :mod:`parplan.server`). Heavy imports happen inside
the handlers, so the planner CLI stays fast and works without the service extras."""

from __future__ import annotations

import argparse
import json
import sys

from parplan.service.command_env import describe, settings_from_env


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from parplan.service.migrate import upgrade

    settings = settings_from_env()
    if settings.embedded:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    upgrade(settings.resolved_database_url, args.revision)
    print(f"parplan db: upgraded to {args.revision} ({describe(settings).split(';')[0]})", file=sys.stderr)
    return 0


def cmd_db_current(args: argparse.Namespace) -> int:
    from parplan.service.migrate import current_revision, head_revision

    settings = settings_from_env()
    cur = current_revision(settings.resolved_database_url)
    head = head_revision()
    print(json.dumps({"current": cur, "head": head, "up_to_date": cur == head}))
    return 0 if cur == head else 1


def cmd_token_create(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import OperationalError, ProgrammingError

    from parplan.cli_args import UsageError
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

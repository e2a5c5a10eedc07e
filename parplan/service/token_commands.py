"""``parplan token list | revoke`` and the ``--expires`` of ``parplan token create``."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_expires(text: str, now: datetime | None = None) -> datetime:
    """``30d``, ``12h``, ``90m``, ``3600s``, ``2w`` from now, or an ISO date/time (UTC unless it says)."""
    now = now or datetime.now(UTC)
    m = re.fullmatch(r"\s*(\d+)\s*([smhdw])\s*", text)
    if m:
        return now + timedelta(seconds=int(m.group(1)) * _UNITS[m.group(2)])
    try:
        at = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"--expires {text!r}: give a duration (30d, 12h, 90m, 3600s, 2w) or an ISO date") from None
    at = at if at.tzinfo else at.replace(tzinfo=UTC)
    if at <= now:
        raise ValueError(f"--expires {text!r} is in the past")
    return at


@contextmanager
def token_session() -> Iterator[Any]:
    """A session on the configured database (the embedded one upgraded first), disposed after."""
    from parplan.service.command_env import settings_from_env, upgrade_schema
    from parplan.service.database import make_engine, make_session_factory

    settings = settings_from_env()
    if settings.embedded:
        upgrade_schema(settings)
    engine = make_engine(settings.resolved_database_url)
    try:
        with make_session_factory(engine)() as session:
            yield session
    finally:
        engine.dispose()


def _guard(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        from sqlalchemy.exc import OperationalError, ProgrammingError

        try:
            return fn(args)
        except (OperationalError, ProgrammingError) as e:
            print(f"parplan token: error: cannot reach the tokens ({e.__class__.__name__}); is the database "
                  "reachable and upgraded (`parplan db upgrade`)?", file=sys.stderr)
            return 2
    return run


def _row(t: Any, now: datetime) -> dict[str, Any]:
    state = ("revoked" if t.revoked_at is not None else
             "expired" if t.expires_at is not None and t.expires_at <= now else "active")
    return {"id": str(t.id), "name": t.name, "prefix": t.prefix, "scopes": list(t.scopes), "state": state,
            "created_at": t.created_at.isoformat(timespec="seconds"),
            "expires_at": t.expires_at.isoformat(timespec="seconds") if t.expires_at else None,
            "revoked_at": t.revoked_at.isoformat(timespec="seconds") if t.revoked_at else None}


@_guard
def cmd_token_list(args: argparse.Namespace) -> int:
    from parplan.service.auth.repository import TokenRepository

    now = datetime.now(UTC)
    with token_session() as s:
        rows = [_row(t, now) for t in TokenRepository(s).all()]
    if not args.all:
        rows = [r for r in rows if r["state"] == "active"]
    if args.json:
        print(json.dumps({"tokens": rows}))
        return 0
    print(f"{'id':36}  {'prefix':10}  {'state':8}  {'expires':25}  {'scopes':24}  name")
    for r in rows:
        print(f"{r['id']:36}  {r['prefix']:10}  {r['state']:8}  {r['expires_at'] or 'never':25}  "
              f"{','.join(r['scopes']):24}  {r['name']}")
    return 0


@_guard
def cmd_token_revoke(args: argparse.Namespace) -> int:
    from parplan.cli_args import UsageError
    from parplan.service.auth.repository import TokenRepository
    from parplan.service.database import utcnow

    with token_session() as s:
        repo = TokenRepository(s)
        found = repo.matching(args.token)
        if not found:
            raise UsageError(f"no token with id or prefix {args.token!r} (see `parplan token list --all`)")
        if len(found) > 1:
            raise UsageError(f"{len(found)} tokens have the prefix {args.token!r}; give the id")
        token = found[0]
        changed = repo.revoke(token.id, utcnow())
        s.commit()
    what = "revoked" if changed else "was already revoked"
    print(f"parplan token: {token.id} ({token.name!r}) {what}; API processes stop accepting it within 5 s",
          file=sys.stderr)
    if args.json:
        print(json.dumps({"id": str(token.id), "revoked": True, "changed": changed}))
    return 0


def register(token_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    lst = token_sub.add_parser("list", help="list tokens (id, prefix, scopes, expiry; never the secret)")
    lst.add_argument("--all", action="store_true", help="include revoked and expired tokens")
    lst.add_argument("--json", action="store_true", help="print one JSON document")
    lst.set_defaults(handler=cmd_token_list)
    rev = token_sub.add_parser("revoke", help="revoke a token by id or by its prefix (first 10 characters)")
    rev.add_argument("token", help="the token's id or prefix, as `parplan token list` shows them")
    rev.add_argument("--json", action="store_true", help="print one JSON document")
    rev.set_defaults(handler=cmd_token_revoke)

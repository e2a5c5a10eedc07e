"""Request-scoped dependencies: the runtime, one unit of work (session) per request, the caller.

Handlers are ``async``; each does its database work in one :meth:`UnitOfWork.run` call, which
runs it on a worker thread together with the commit (one thread hop per request, none for auth
when the token is cached) — the event loop itself never waits on the database.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import Engine
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from parplan.service.auth.service import ANONYMOUS, Principal, Scope
from parplan.service.problems import ForbiddenError, UnauthorizedError
from parplan.service.runtime import Runtime

T = TypeVar("T")


async def get_runtime(request: Request) -> Runtime:
    rt: Runtime = request.app.state.runtime
    return rt


class UnitOfWork:
    """The request's session: :meth:`run` opens it, runs the handler's work, commits once (or rolls
    back on an error), closes it, then runs the ``after_commit`` callbacks — e.g. enqueueing a job,
    which must never happen before the job row is committed."""

    def __init__(self, session_factory: Callable[[], Session]) -> None:
        self._factory = session_factory
        self._after: list[Callable[[], Any]] = []
        self._used = False

    def after_commit(self, fn: Callable[[], Any]) -> None:
        self._after.append(fn)

    def _work(self, fn: Callable[[Session], T], read_only: bool) -> T:
        session = self._factory()
        try:
            if read_only and isinstance(session.get_bind(), Engine):
                # Reads need no transaction: skip the BEGIN and COMMIT round trips.
                session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
            out = fn(session)
            session.commit()
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()
        for cb in self._after:
            cb()
        return out

    async def run(self, fn: Callable[[Session], T], *, read_only: bool = False) -> T:
        """``fn(session)`` on a worker thread, then commit; once per request. ``read_only`` work
        runs without a transaction (autocommit), which saves two round trips on PostgreSQL."""
        if self._used:
            raise RuntimeError("one unit of work per request")
        self._used = True
        return await run_in_threadpool(self._work, fn, read_only)


async def _unit_of_work(request: Request) -> UnitOfWork:
    return UnitOfWork(request.app.state.runtime.session_factory)


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
UoW = Annotated[UnitOfWork, Depends(_unit_of_work)]

_bearer = HTTPBearer(auto_error=False, description="A token from `parplan token create --scope ...`.")


async def get_principal(request: Request,
                        creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> Principal:
    """The caller, within its rate limit (429 beyond it; per token, or per address without one)."""
    principal = await _identify(request, creds)
    limiter = request.app.state.runtime.rate_limiter
    if limiter is not None:
        if principal.token_id is not None:
            limiter.check(principal.token_id, f"token {principal.name!r}")
        else:
            limiter.check(("address", request.client.host if request.client else ""), "this client address")
    return principal


async def _identify(request: Request, creds: HTTPAuthorizationCredentials | None) -> Principal:
    """The caller. Tokens are looked up by hash and remembered for a few seconds; a lookup uses its
    own short session on a worker thread, so a long-polling endpoint holds no connection."""
    rt: Runtime = request.app.state.runtime
    if creds is not None and creds.credentials:
        secret = creds.credentials.strip()
        principal = rt.verifier.cached(secret)
        if principal is None:
            principal = await run_in_threadpool(rt.verifier.verify, rt.session_factory, secret)
        if principal is None:
            raise UnauthorizedError("the bearer token is invalid or revoked")
        return principal
    if request.headers.get("authorization"):
        raise UnauthorizedError("use an Authorization: Bearer <token> header")
    if not rt.settings.auth_required:
        return ANONYMOUS
    raise UnauthorizedError("this endpoint needs a bearer token (Authorization: Bearer <token>)")


def require(*scopes: Scope) -> Any:
    """A dependency admitting callers with any of ``scopes`` (``admin`` admits everything)."""
    wanted = ", ".join(s.value for s in scopes)

    async def dependency(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
        if not principal.has_any(*scopes):
            held = ", ".join(sorted(s.value for s in principal.scopes)) or "none"
            raise ForbiddenError(f"this endpoint needs the scope {wanted}; the token has: {held}")
        return principal

    return Depends(dependency)

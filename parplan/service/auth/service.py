"""Bearer tokens with scopes. The secret is shown once; the database keeps its SHA-256
(tokens are 256-bit random, so a fast hash is enough: there is nothing to brute-force).

Scopes: ``plans:write`` (submit plans, cancel jobs, queue validations; implies ``plans:read``),
``plans:read`` (read jobs, plans, validations, profiles), ``agent`` (the validation agent's
endpoints only), ``admin`` (everything).
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from sqlalchemy.orm import Session

from parplan.service.auth.repository import TokenRepository
from parplan.service.models import ApiToken

TOKEN_PREFIX = "ppt_"


class Scope(StrEnum):
    PLANS_WRITE = "plans:write"
    PLANS_READ = "plans:read"
    AGENT = "agent"
    ADMIN = "admin"


_IMPLIES: dict[Scope, frozenset[Scope]] = {
    Scope.ADMIN: frozenset(Scope),
    Scope.PLANS_WRITE: frozenset({Scope.PLANS_WRITE, Scope.PLANS_READ}),
    Scope.PLANS_READ: frozenset({Scope.PLANS_READ}),
    Scope.AGENT: frozenset({Scope.AGENT}),
}


def effective(scopes: frozenset[Scope] | set[Scope]) -> frozenset[Scope]:
    out: set[Scope] = set()
    for s in scopes:
        out |= _IMPLIES[s]
    return frozenset(out)


@dataclass(frozen=True)
class Principal:
    """Who is calling: a token (``token_id``) or, with auth disabled on loopback, anonymous."""

    token_id: uuid.UUID | None
    name: str
    scopes: frozenset[Scope]
    expires_at: datetime | None = None

    def has_any(self, *wanted: Scope) -> bool:
        return any(w in self.scopes for w in wanted)


ANONYMOUS = Principal(token_id=None, name="anonymous (auth disabled on loopback)", scopes=frozenset(Scope))


def hash_token(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def parse_scopes(values: list[str]) -> frozenset[Scope]:
    """Scopes from CLI words (repeated or comma-separated); ValueError names an unknown one."""
    out: set[Scope] = set()
    for v in values:
        for word in filter(None, (w.strip() for w in v.split(","))):
            try:
                out.add(Scope(word))
            except ValueError:
                raise ValueError(f"unknown scope {word!r}; known: {', '.join(s.value for s in Scope)}") from None
    if not out:
        raise ValueError("give at least one scope")
    return frozenset(out)


def create_token(session: Session, name: str, scopes: frozenset[Scope],
                 expires_at: datetime | None = None) -> tuple[ApiToken, str]:
    """A new token row and its secret (shown once, never stored); it stops working at ``expires_at``."""
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = TokenRepository(session).add(ApiToken(name=name, token_hash=hash_token(secret), prefix=secret[:10],
                                                scopes=sorted(s.value for s in scopes), expires_at=expires_at))
    return row, secret


def _expired(principal: Principal | None) -> bool:
    return principal is not None and principal.expires_at is not None and principal.expires_at <= datetime.now(UTC)


class TokenVerifier:
    """Looks tokens up by hash, remembering answers for ``ttl_seconds`` (so a revocation takes
    effect within that time) to keep the database off the hot path."""

    def __init__(self, ttl_seconds: float = 5.0, max_entries: int = 10_000) -> None:
        self.ttl = ttl_seconds
        self.max_entries = max_entries
        self._cache: dict[str, tuple[float, Principal | None]] = {}
        self._lock = threading.Lock()

    def cached(self, secret: str) -> Principal | None:
        """The principal for ``secret`` if a valid one is remembered (no database access)."""
        hit = self._cache.get(hash_token(secret))
        if hit is not None and time.monotonic() - hit[0] < self.ttl and not _expired(hit[1]):
            return hit[1]
        return None

    def verify(self, session_factory: Callable[[], Session], secret: str) -> Principal | None:
        """Look ``secret`` up (through the cache); None when unknown or revoked."""
        digest = hash_token(secret)
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(digest)
        if hit is not None and now - hit[0] < self.ttl:
            return None if _expired(hit[1]) else hit[1]
        with session_factory() as session:
            row = TokenRepository(session).by_hash(digest)
        principal = None
        if row is not None and row.revoked_at is None:
            principal = Principal(token_id=row.id, name=row.name,
                                  scopes=effective({Scope(s) for s in row.scopes if s in Scope._value2member_map_}),
                                  expires_at=row.expires_at)
            if _expired(principal):
                principal = None
        with self._lock:
            if len(self._cache) >= self.max_entries:
                self._cache.clear()
            self._cache[digest] = (now, principal)
        return principal

"""All queries on ``api_tokens``."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from parplan.service.models import ApiToken


class TokenRepository:
    def __init__(self, session: Session) -> None:
        self.session = session

    def by_hash(self, token_hash: str) -> ApiToken | None:
        return self.session.scalars(select(ApiToken).where(ApiToken.token_hash == token_hash)).first()

    def add(self, token: ApiToken) -> ApiToken:
        self.session.add(token)
        self.session.flush()
        return token

    def all(self) -> list[ApiToken]:
        return list(self.session.scalars(select(ApiToken).order_by(ApiToken.created_at, ApiToken.id)))

    def matching(self, ident: str) -> list[ApiToken]:
        """Tokens whose id or shown prefix is ``ident`` (the secret's first 10 characters)."""
        try:
            by_id = self.session.get(ApiToken, uuid.UUID(ident))
        except ValueError:
            by_id = None
        if by_id is not None:
            return [by_id]
        return list(self.session.scalars(select(ApiToken).where(ApiToken.prefix == ident)))

    def revoke(self, token_id: uuid.UUID, now: datetime) -> bool:
        res = self.session.execute(update(ApiToken).where(ApiToken.id == token_id, ApiToken.revoked_at.is_(None))
                                   .values(revoked_at=now).execution_options(synchronize_session=False))
        return getattr(res, "rowcount", 0) == 1

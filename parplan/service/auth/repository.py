"""All queries on ``api_tokens``."""

from __future__ import annotations

from sqlalchemy import select
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

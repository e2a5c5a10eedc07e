"""Keyset (cursor) pagination over ``(created_at, id)``, newest first. Cursors are opaque."""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, and_, or_
from sqlalchemy.orm import InstrumentedAttribute

from parplan.service.problems import InvalidError, field_error

DEFAULT_LIMIT = 50
MAX_LIMIT = 500


@dataclass(frozen=True)
class Cursor:
    created_at: datetime
    id: uuid.UUID

    def encode(self) -> str:
        raw = json.dumps([self.created_at.isoformat(), str(self.id)]).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @staticmethod
    def decode(text: str) -> Cursor:
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
            created, ident = json.loads(raw)
            return Cursor(datetime.fromisoformat(created), uuid.UUID(ident))
        except (ValueError, TypeError) as e:
            raise InvalidError("cursor: not a cursor this API returned",
                          [field_error(["query", "cursor"], f"invalid cursor ({e.__class__.__name__})")]) from None


def page(stmt: Select[Any], created: InstrumentedAttribute[datetime], ident: InstrumentedAttribute[uuid.UUID],
         cursor: str | None, limit: int) -> Select[Any]:
    """``stmt`` ordered newest first, after ``cursor``, one row more than ``limit`` (to tell if more exist)."""
    if cursor:
        c = Cursor.decode(cursor)
        stmt = stmt.where(or_(created < c.created_at, and_(created == c.created_at, ident < c.id)))
    return stmt.order_by(created.desc(), ident.desc()).limit(limit + 1)


def next_cursor(rows: list[Any], limit: int) -> tuple[list[Any], str | None]:
    """Trim the extra row of :func:`page` and give the cursor of the next page, if there is one."""
    if len(rows) <= limit:
        return rows, None
    rows = rows[:limit]
    last = rows[-1]
    return rows, Cursor(last.created_at, last.id).encode()

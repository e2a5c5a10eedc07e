"""Keyset (cursor) pagination over ``(created_at, id)``, newest first. Cursors are opaque to
clients; their form (microseconds since the epoch, a dot, the id's 32 hex digits) is published as
:data:`CURSOR_PATTERN`, so any string the OpenAPI document allows names a position."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import Query
from sqlalchemy import Select, and_, or_
from sqlalchemy.orm import InstrumentedAttribute

from parplan.service.problems import InvalidError, field_error

DEFAULT_LIMIT = 50
MAX_LIMIT = 500
#: Every cursor matches this (at most 17 digits of microseconds: before the year 5000).
CURSOR_PATTERN = r"^[0-9]{1,17}\.[0-9a-f]{32}$"
_CURSOR = re.compile(CURSOR_PATTERN)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Cursor:
    created_at: datetime
    id: uuid.UUID

    def encode(self) -> str:
        at = self.created_at if self.created_at.tzinfo else self.created_at.replace(tzinfo=UTC)
        micros = (at - _EPOCH) // timedelta(microseconds=1)
        return f"{micros}.{self.id.hex}"

    @staticmethod
    def decode(text: str) -> Cursor:
        if not _CURSOR.match(text):
            raise InvalidError("cursor: not a cursor this API returned",
                               [field_error(["query", "cursor"], f"must match {CURSOR_PATTERN}",
                                            "string_pattern_mismatch")])
        micros, ident = text.split(".")
        return Cursor(_EPOCH + timedelta(microseconds=int(micros)), uuid.UUID(hex=ident))


#: The ``cursor`` query parameter of list endpoints.
CursorParam = Annotated[str | None, Query(pattern=CURSOR_PATTERN, description="`next_cursor` of the page before.")]


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

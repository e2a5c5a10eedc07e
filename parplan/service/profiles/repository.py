"""All queries on ``profiles``."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from parplan.service.models import Profile, ProfileKind
from parplan.service.pagination import next_cursor, page


class ProfileRepository:
    def __init__(self, session: Session) -> None:
        self.session = session

    def add(self, profile: Profile) -> Profile:
        self.session.add(profile)
        self.session.flush()
        return profile

    def list_page(self, hardware_key: str | None, kind: str | None, cursor: str | None,
             limit: int) -> tuple[list[Profile], str | None]:
        stmt = select(Profile)
        if hardware_key is not None:
            stmt = stmt.where(Profile.hardware_key == hardware_key)
        if kind is not None:
            stmt = stmt.where(Profile.kind == kind)
        rows = list(self.session.scalars(page(stmt, Profile.created_at, Profile.id, cursor, limit)))
        return next_cursor(rows, limit)

    def latest_calibration(self, gpu: str) -> dict[str, Any] | None:
        """The newest microbenchmark calibration measured on GPU preset ``gpu``, if any."""
        stmt = (select(Profile.calibration)
                .where(Profile.gpu == gpu, Profile.kind == ProfileKind.MICROBENCHMARK.value,
                       Profile.calibration.is_not(None))
                .order_by(Profile.created_at.desc(), Profile.id.desc()).limit(1))
        value = self.session.scalar(stmt)
        return dict(value) if value else None

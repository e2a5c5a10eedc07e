"""All queries on ``plans``."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from parplan.service.models import Job, Plan


class PlanRepository:
    def __init__(self, session: Session) -> None:
        self.session = session

    def get(self, plan_id: uuid.UUID) -> Plan | None:
        return self.session.get(Plan, plan_id)

    def by_cache_key(self, cache_key: str) -> Plan | None:
        return self.session.scalars(select(Plan).where(Plan.cache_key == cache_key)).first()

    def cached_with_job(self, cache_key: str) -> tuple[Plan, Job] | None:
        """The plan stored under ``cache_key`` and the job that produced it, in one query."""
        stmt = (select(Plan, Job).join(Job, Job.plan_id == Plan.id).where(Plan.cache_key == cache_key)
                .order_by(Job.created_at).limit(1))
        row = self.session.execute(stmt).first()
        return None if row is None else (row[0], row[1])

    def get_or_create(self, cache_key: str, **fields: Any) -> Plan:
        """The plan under ``cache_key``, inserting it if absent (a concurrent insert wins quietly)."""
        found = self.by_cache_key(cache_key)
        if found is not None:
            return found
        plan = Plan(cache_key=cache_key, **fields)
        try:
            with self.session.begin_nested():
                self.session.add(plan)
        except IntegrityError:
            found = self.by_cache_key(cache_key)
            if found is None:
                raise
            return found
        return plan

"""All queries on ``agents``."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from parplan.service.models import Agent
from parplan.service.pagination import next_cursor, page


class AgentRepository:
    def __init__(self, session: Session) -> None:
        self.session = session

    def get(self, agent_id: uuid.UUID) -> Agent | None:
        return self.session.get(Agent, agent_id)

    def add(self, agent: Agent) -> Agent:
        self.session.add(agent)
        self.session.flush()
        return agent

    def heartbeat(self, agent_id: uuid.UUID, now: datetime) -> None:
        self.session.execute(update(Agent).where(Agent.id == agent_id).values(last_heartbeat_at=now)
                             .execution_options(synchronize_session=False))

    def list_page(self, cursor: str | None, limit: int) -> tuple[list[Agent], str | None]:
        rows = list(self.session.scalars(page(select(Agent), Agent.created_at, Agent.id, cursor, limit)))
        return next_cursor(rows, limit)

"""Agents: register, heartbeat, and the ownership check every agent call makes."""

from __future__ import annotations

import uuid

from sqlalchemy.orm import Session

from parplan.service.agents.repository import AgentRepository
from parplan.service.agents.schemas import AgentRegister
from parplan.service.auth.service import Principal, Scope
from parplan.service.database import utcnow
from parplan.service.models import Agent
from parplan.service.problems import ForbiddenError, NotFoundError


def register(session: Session, payload: AgentRegister, principal: Principal) -> Agent:
    now = utcnow()
    return AgentRepository(session).add(Agent(
        name=payload.name, hardware=payload.hardware.model_dump(), hardware_key=payload.hardware.key,
        token_id=principal.token_id, created_at=now, last_heartbeat_at=now))


def owned_agent(session: Session, agent_id: uuid.UUID | str, principal: Principal) -> Agent:
    """The agent, if the caller registered it (or is admin / auth is off). 404 / 403 otherwise."""
    try:
        ident = agent_id if isinstance(agent_id, uuid.UUID) else uuid.UUID(agent_id)
    except ValueError:
        raise NotFoundError(f"no agent {agent_id!r}") from None
    agent = AgentRepository(session).get(ident)
    if agent is None:
        raise NotFoundError(f"no agent {agent_id}; register it first (POST /v1/agents/register)")
    if agent.token_id is not None and agent.token_id != principal.token_id and Scope.ADMIN not in principal.scopes:
        raise ForbiddenError(f"agent {agent.id} was registered with another token")
    return agent


def heartbeat(session: Session, agent_id: str, principal: Principal) -> Agent:
    agent = owned_agent(session, agent_id, principal)
    AgentRepository(session).heartbeat(agent.id, utcnow())
    session.refresh(agent)
    return agent

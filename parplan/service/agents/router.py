"""``/v1/agents``: registration and heartbeats of validation agents."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session

from parplan.service.agents import service
from parplan.service.agents.repository import AgentRepository
from parplan.service.agents.schemas import AgentEnvelope, AgentPage, AgentRegister, agent_out
from parplan.service.auth.service import Principal, Scope
from parplan.service.deps import UoW, require
from parplan.service.pagination import DEFAULT_LIMIT, MAX_LIMIT, CursorParam
from parplan.service.problems import PROBLEM_JSON

router = APIRouter(prefix="/v1/agents", tags=["agents"])
_PROBLEM = {"content": {PROBLEM_JSON: {}}, "description": "RFC 9457 problem"}


@router.post("/register", status_code=201, response_model=AgentEnvelope, responses={422: _PROBLEM})
async def register_agent(payload: AgentRegister, uow: UoW,
                         principal: Annotated[Principal, require(Scope.AGENT)]) -> JSONResponse:
    """Register an agent (scope ``agent``); keep the returned id for every later call."""
    agent = await uow.run(lambda s: agent_out(service.register(s, payload, principal)))
    return JSONResponse({"agent": agent}, status_code=201, headers={"Location": f"/v1/agents/{agent['id']}"})


@router.post("/{agent_id}/heartbeat", response_model=AgentEnvelope, responses={403: _PROBLEM, 404: _PROBLEM})
async def heartbeat(agent_id: str, uow: UoW,
                    principal: Annotated[Principal, require(Scope.AGENT)]) -> JSONResponse:
    """Tell the service the agent is alive; one claimed validation is kept while heartbeats come."""
    return JSONResponse({"agent": await uow.run(lambda s: agent_out(service.heartbeat(s, agent_id, principal)))})


@router.get("", response_model=AgentPage)
async def list_agents(uow: UoW, _: Annotated[Principal, require(Scope.PLANS_READ)],
                cursor: CursorParam = None,
                limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = DEFAULT_LIMIT) -> JSONResponse:
    def work(session: Session) -> dict[str, Any]:
        rows, nxt = AgentRepository(session).list_page(cursor, limit)
        return {"agents": [agent_out(a) for a in rows], "next_cursor": nxt}
    return JSONResponse(await uow.run(work, read_only=True))

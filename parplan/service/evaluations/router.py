"""``POST /v1/evaluations``: memory per category and step time of a trainer's own configuration."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from parplan.service.auth.service import Principal, Scope
from parplan.service.deps import require
from parplan.service.evaluations.schemas import EvaluationIn
from parplan.service.problems import PROBLEM_JSON, InvalidError, field_error

router = APIRouter(prefix="/v1/evaluations", tags=["evaluations"])

_PROBLEM = {"content": {PROBLEM_JSON: {}}, "description": "RFC 9457 problem"}


def _evaluate(payload: EvaluationIn) -> dict[str, Any]:
    """Read the file and price it (one evaluation: milliseconds to a second, never a search)."""
    from parplan.imports import ImportProblemError, price, read_config
    from parplan.solver.cluster import make_cluster
    from parplan.solver.errors import SolverError
    from parplan.solver.request import RequestError

    try:
        model = payload.model.source() if payload.model is not None else None
    except RequestError as e:
        raise InvalidError(str(e), [field_error(["body", *e.field.split(".")], str(e))]) from None
    cl = payload.cluster
    try:
        imported = read_config(payload.kind, payload.text, model=model, gpus=cl.gpus, seq_len=payload.seq_len,
                               launch=payload.launch)
        assert imported.model is not None and imported.gpus is not None
        cluster = make_cluster(imported.gpus, cl.gpus_per_node or imported.gpus_per_node, cl.gpu, cl.gpu_memory_gib,
                               cl.host_memory_gib)
        return price(imported, cluster)
    except ImportProblemError as e:
        raise InvalidError(str(e), [field_error(["body", "text"], p) for p in e.problems]) from None
    except SolverError as e:
        raise InvalidError(str(e), [field_error(["body"], str(e))]) from None


@router.post("", responses={200: {"description": "The configuration's memory and step time"}, 401: _PROBLEM,
                            403: _PROBLEM, 422: _PROBLEM})
async def create_evaluation(payload: Annotated[EvaluationIn, Body()],
                            _: Annotated[Principal, require(Scope.PLANS_READ)]) -> JSONResponse:
    """Price the configuration a user already runs: the keys of ``parplan memory --json``, plus
    ``import`` (``unknown``: settings parplan does not know, listed, not used; ``ignored``: known
    ones that do not change the prediction). A setting that changes memory or time and is not
    modelled, or sizes that do not add up, is a 422 naming each."""
    return JSONResponse(await run_in_threadpool(_evaluate, payload))

"""A Python client of the parplan planning service, for orchestrators: submit a plan request,
wait for it (Server-Sent Events, falling back to long polls), fetch and export the plan.
:class:`Client` blocks; :class:`AsyncClient` is the asyncio twin. Errors are typed from the
service's problem documents (:mod:`parplan.client.errors`). Needs ``httpx`` (the ``service`` extra)."""

from parplan.client.asynchronous import AsyncClient
from parplan.client.errors import (
    ApiError,
    BadRequestError,
    ConflictError,
    ForbiddenError,
    InvalidRequestError,
    JobCancelledError,
    JobFailedError,
    NotFoundError,
    ParplanError,
    RateLimitedError,
    ServerError,
    TooLargeError,
    UnauthorizedError,
    UnavailableError,
    UnreachableError,
    WaitTimeoutError,
)
from parplan.client.sync import Client

__all__ = [
    "ApiError",
    "AsyncClient",
    "BadRequestError",
    "Client",
    "ConflictError",
    "ForbiddenError",
    "InvalidRequestError",
    "JobCancelledError",
    "JobFailedError",
    "NotFoundError",
    "ParplanError",
    "RateLimitedError",
    "ServerError",
    "TooLargeError",
    "UnauthorizedError",
    "UnavailableError",
    "UnreachableError",
    "WaitTimeoutError",
]

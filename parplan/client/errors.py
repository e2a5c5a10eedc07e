"""The client's exceptions: one class per kind of problem document (RFC 9457) the service answers
with, plus the ends of a wait that are not a plan."""

from __future__ import annotations

from typing import Any


class ParplanError(Exception):
    """Anything the client raises."""


class UnreachableError(ParplanError):
    """The service could not be reached (after the retries)."""


class WaitTimeoutError(ParplanError):
    """The job did not finish within the wait's timeout (it goes on running on the server)."""

    def __init__(self, message: str, job: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.job = job


class JobFailedError(ParplanError):
    """The job ended ``failed``; ``code`` is its error's code (unsolvable, timeout, internal, ...)."""

    def __init__(self, job: dict[str, Any]) -> None:
        err = job.get("error") or {}
        self.job = job
        self.code = str(err.get("code", "unknown"))
        super().__init__(f"job {job.get('id')} failed ({self.code}): {err.get('message', 'no message')}")


class JobCancelledError(ParplanError):
    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job
        super().__init__(f"job {job.get('id')} was cancelled")


class ApiError(ParplanError):
    """The service answered with an error: ``status``, the problem document and its fields."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        self.status = status
        self.problem = problem
        self.type = str(problem.get("type", "about:blank"))
        self.title = str(problem.get("title", ""))
        self.detail = str(problem.get("detail", f"HTTP {status}"))
        self.errors: list[dict[str, Any]] = [e for e in problem.get("errors") or [] if isinstance(e, dict)]
        super().__init__(f"{status} {self.title}: {self.detail}" if self.title else f"{status}: {self.detail}")


class BadRequestError(ApiError):
    """400: e.g. a body that is not JSON."""


class UnauthorizedError(ApiError):
    """401: no token, or one the service does not know."""


class ForbiddenError(ApiError):
    """403: the token lacks the scope."""


class NotFoundError(ApiError):
    """404."""


class ConflictError(ApiError):
    """409: e.g. cancelling a finished job."""


class TooLargeError(ApiError):
    """413: the request (or its graph) is over the service's limits."""


class InvalidRequestError(ApiError):
    """422: ``errors`` names each failing field (``field``, ``message``)."""


class RateLimitedError(ApiError):
    """429 (retried first; raised when the retries ran out)."""


class UnavailableError(ApiError):
    """503 (retried first)."""


class ServerError(ApiError):
    """Any other 5xx."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequestError, 401: UnauthorizedError, 403: ForbiddenError, 404: NotFoundError, 409: ConflictError,
    413: TooLargeError, 422: InvalidRequestError, 429: RateLimitedError, 503: UnavailableError}


def error_for(status: int, problem: dict[str, Any]) -> ApiError:
    """The exception for an error answer."""
    cls = _BY_STATUS.get(status) or (ServerError if status >= 500 else ApiError)
    return cls(status, problem)

"""Which database errors mean "the database cannot serve right now" (the API answers 503 with
``Retry-After``) rather than a bug (500).

- PostgreSQL: the server cannot be reached, is starting or shutting down, dropped the connection,
  ran out of resources (disk, connections) or is a read-only standby; the connection pool is
  exhausted.
- SQLite: the file cannot be written (read-only file or directory), the disk or a file-size limit
  is full, an I/O error, the file cannot be opened, or another process holds the lock too long.

Errors in a query itself (a syntax error, a missing table, a constraint) are not listed: they stay
500, because retrying cannot help.
"""

from __future__ import annotations

from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

#: SQLite primary result codes of a store that cannot be used now (https://sqlite.org/rescode.html).
_SQLITE_UNAVAILABLE = {5: "locked by another process (SQLITE_BUSY)", 6: "table locked (SQLITE_LOCKED)",
                       8: "read-only (SQLITE_READONLY)", 10: "I/O error (SQLITE_IOERR)",
                       13: "disk or file-size limit full (SQLITE_FULL)", 14: "cannot open the file (SQLITE_CANTOPEN)"}
#: PostgreSQL SQLSTATEs that are not OperationalError in psycopg but still mean "not now":
#: 25006 read_only_sql_transaction (a standby, or a failover in progress).
_POSTGRES_STATES = {"25006": "read-only (a standby server)"}


def unavailable_reason(exc: BaseException) -> str | None:
    """A short reason when ``exc`` says the database cannot serve now, else None."""
    if isinstance(exc, PoolTimeout):
        return "no free database connection (the pool is exhausted)"
    if not isinstance(exc, DBAPIError):
        return None
    orig = exc.orig
    code = getattr(orig, "sqlite_errorcode", None)  # sqlite3 errors carry it (Python 3.11+)
    if code is not None:
        reason = _SQLITE_UNAVAILABLE.get(int(code) & 0xFF)
        name = getattr(orig, "sqlite_errorname", None)
        return f"{reason.split(' (')[0]} ({name})" if reason and name else reason
    if exc.connection_invalidated:
        return "the connection to the database was lost"
    state = getattr(orig, "sqlstate", None)
    if state in _POSTGRES_STATES:
        return _POSTGRES_STATES[str(state)]
    if isinstance(exc, OperationalError):
        return f"the database cannot be reached ({orig.__class__.__name__})"
    return None

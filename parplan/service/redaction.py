"""Secrets never reach the logs: every log record's message (and its traceback text) is
rewritten before any handler sees it, replacing bearer tokens (``ppt_…``, ``Bearer …``) and the
passwords of URLs (``postgresql://user:secret@host``) with ``[REDACTED]``.

Installed once per process (:func:`install`) as the log record factory, so it covers the
service's loggers, uvicorn's, SQLAlchemy's and Celery's alike, whatever handlers they use.
"""

from __future__ import annotations

import logging
import re
import traceback
from typing import Any

_PATTERNS = [
    (re.compile(r"ppt_[A-Za-z0-9_\-]{8,}"), "ppt_[REDACTED]"),
    (re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/\-]+=*"), r"\1[REDACTED]"),
    (re.compile(r"([a-zA-Z][a-zA-Z0-9+.\-]*://[^:/@\s]*:)[^@\s]+@"), r"\1[REDACTED]@"),
]

_installed = False


def redact(text: str) -> str:
    """``text`` with tokens and URL passwords replaced."""
    for pattern, repl in _PATTERNS:
        text = pattern.sub(repl, text)
    return text


def install() -> None:
    """Wrap the process's log record factory so every record is redacted (idempotent)."""
    global _installed
    if _installed:
        return
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        # Arguments one by one first: formatters that read record.args (uvicorn's access log) keep working.
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: redact(v) if isinstance(v, str) else v for k, v in record.args.items()}
        try:
            message = record.getMessage()
        except Exception:  # a bad format string: let the handler report it as usual
            return record
        cleaned = redact(message)
        if cleaned != message:  # a secret inside an argument that is no string (an exception, a URL object)
            record.msg, record.args = cleaned, None
        if record.exc_info and record.exc_info[0] is not None and not record.exc_text:
            record.exc_text = redact("".join(traceback.format_exception(*record.exc_info)).rstrip("\n"))
        return record

    logging.setLogRecordFactory(factory)
    _installed = True

"""Strings a JSON body may not carry: NUL (PostgreSQL refuses it in text and JSONB) and lone
UTF-16 surrogates (``"\\ud800"``: no Unicode character, so no UTF-8 to store). Both are a 422
naming the place, checked once for every request body, before any handler stores anything.

Bodies are scanned as bytes first; only one holding a ``\\u0000`` or ``\\uD800``-``\\uDFFF``
escape is parsed and walked (surrogate pairs, e.g. an emoji, are fine).
"""

from __future__ import annotations

import json
import re
from typing import Any

from fastapi import Request

from parplan.service.problems import InvalidError, field_error

_SUSPECT = re.compile(rb"\\u(0000|[dD][89a-fA-F][0-9a-fA-F]{2})")


def _bad(text: str) -> str | None:
    if "\x00" in text:
        return "contains NUL (\\u0000)"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone UTF-16 surrogate (not a Unicode character)"
    return None


def find_unstorable(value: Any, loc: list[str | int]) -> tuple[list[str | int], str] | None:
    """The first string (key or value) in ``value`` that cannot be stored, and why; None if none."""
    if isinstance(value, str):
        why = _bad(value)
        return (loc, why) if why else None
    if isinstance(value, dict):
        for k, v in value.items():
            why = _bad(k)
            if why:
                return [*loc, k.encode("utf-8", "backslashreplace").decode()], f"key {why}"
            found = find_unstorable(v, [*loc, k])
            if found:
                return found
    if isinstance(value, list):
        for i, v in enumerate(value):
            found = find_unstorable(v, [*loc, i])
            if found:
                return found
    return None


async def check_json_text(request: Request) -> None:
    """App-wide dependency: 422 for a JSON body holding a string that cannot be stored."""
    if request.method not in ("POST", "PUT", "PATCH"):
        return
    body = await request.body()
    if not _SUSPECT.search(body):
        return
    try:
        doc = json.loads(body)
    except ValueError:
        return  # malformed JSON: the body's own validation answers 400
    found = find_unstorable(doc, ["body"])
    if found:
        loc, why = found
        safe = [p if isinstance(p, int) else p.encode("utf-8", "backslashreplace").decode() for p in loc]
        raise InvalidError(f"{'.'.join(map(str, safe[1:])) or 'body'}: {why}", [field_error(safe, why, "string_text")])

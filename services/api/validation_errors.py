"""The 422 answer to a request that failed validation, which must not fail itself: FastAPI's own echoes
each error's input as given, and an input holding NaN, a lone surrogate or megabytes of text cannot be
encoded (a 500) or should not be sent back whole. Here every echoed value is made JSON-safe and bounded."""

from __future__ import annotations

import math
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

MAX_ECHO_CHARS = 200
MAX_ECHO_ITEMS = 20
MAX_ECHO_DEPTH = 4
MAX_ERRORS = 50


def json_safe(value: Any, depth: int = 0) -> Any:
    """``value`` as JSON data that encodes whatever it held: strings cut and their surrogates escaped,
    NaN and infinities as text, containers cut to a few items and levels, anything else as its type's name."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if abs(value) < 2**63 else f"<integer of {value.bit_length()} bits>"
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, str):
        cut = value if len(value) <= MAX_ECHO_CHARS else value[:MAX_ECHO_CHARS] + f"... ({len(value)} characters)"
        return cut.encode("utf-8", "backslashreplace").decode("utf-8")
    if depth >= MAX_ECHO_DEPTH:
        return f"<{type(value).__name__}>"
    if isinstance(value, dict):
        return {json_safe(str(k)): json_safe(v, depth + 1) for k, v in list(value.items())[:MAX_ECHO_ITEMS]}
    if isinstance(value, (list, tuple)):
        return [json_safe(item, depth + 1) for item in list(value)[:MAX_ECHO_ITEMS]]
    if isinstance(value, BaseException):
        return json_safe(str(value), depth)
    return f"<{type(value).__name__}>"


async def validation_error_answer(request: Request, exc: Exception) -> JSONResponse:
    """Exception handler for ``RequestValidationError``: FastAPI's shape (``detail``: the errors with
    ``type``, ``loc``, ``msg``, ``input``, ``ctx``), every value passed through ``json_safe``."""
    assert isinstance(exc, RequestValidationError)
    errors = [json_safe(error) for error in exc.errors()[:MAX_ERRORS]]
    return JSONResponse({"detail": errors}, status_code=422)

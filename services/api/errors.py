"""The error answers a route documents in its OpenAPI, so a client (and schemathesis) knows every status
it may get: the shared ones are given once here, each route adds its own (a 404 for an id it looks up)."""

from __future__ import annotations

from typing import Any

from services.schemas.errors import ErrorAnswer

MEANINGS = {
    400: "refused: the request is well-formed but cannot be carried out (the reason says why)",
    401: "missing, invalid or revoked API key",
    403: "the route needs an admin API key",
    404: "nothing with that id",
    413: "body larger than KZ_MAX_REQUEST_BYTES; refused unread",
    429: "over this key's quota; Retry-After says when the request would fit",
    503: "a store the route needs (the database, Redis) does not answer; Retry-After says when to try again",
}


def error_answers(*codes: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route or router: each code with its meaning and the ``ErrorAnswer`` body."""
    return {code: {"model": ErrorAnswer, "description": MEANINGS[code]} for code in codes}

"""Request bodies parsed as strict JSON (RFC 8259, I-JSON): Python's ``json`` accepts ``NaN`` and
``Infinity`` literals and lone surrogates (``"\\ud800"``), which no JSON encoder can write back, so a
value carrying one could reach a log, the database or an error reply and fail there. Here such a body
is malformed JSON, a 422 like any other."""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

import pydantic_core
from fastapi import Request, Response
from fastapi.routing import APIRoute


class StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            try:
                self._json = pydantic_core.from_json(body, allow_inf_nan=False)
            except ValueError as exc:
                # FastAPI answers a JSONDecodeError with its 422 "json_invalid"; the message says what was wrong.
                raise json.JSONDecodeError(f"{exc} (strict JSON: no NaN, Infinity or lone surrogates)", "", 0) from None
        return self._json


class StrictJSONRoute(APIRoute):
    """Every /v1 router's route class: its JSON bodies parsed by ``StrictJSONRequest``."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict_handler(request: Request) -> Response:
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict_handler

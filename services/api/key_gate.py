"""Checks a /v1 request's API key before anything reads its body: FastAPI reads a body before it runs
a route's dependencies, so without this a caller with no key could make a service read (and parse) a
body as large as the limit before its 401."""

from __future__ import annotations

from fastapi import HTTPException
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from services.api.unavailable import UNAVAILABLE, unavailable_answer
from services.auth import authenticate, presented_key
from services.config import get_settings

KEYED_PREFIX = "/v1/"  # every /v1 route needs a key (require_api_key); health and metrics need none


class KeyGate:
    """ASGI middleware: 401 for a /v1 request without a valid key, its body unread; the checked key goes
    to ``request.state.api_key`` so the route's dependency does not look it up again."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(KEYED_PREFIX) and get_settings().auth_enabled:
            request = Request(scope)
            try:
                request.state.api_key = await run_in_threadpool(authenticate, await presented_key(request))
            except HTTPException as refused:
                await JSONResponse({"detail": refused.detail}, refused.status_code)(scope, receive, send)
                return
            except UNAVAILABLE as away:  # the key's lookup needs the database: 503, as a route would answer
                await unavailable_answer(away)(scope, receive, send)
                return
        await self.app(scope, receive, send)

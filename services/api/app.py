"""Builds each service's FastAPI app: /healthz, /readyz, /metrics, /v1 routes, request ids."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import redis
import structlog
from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline
from prometheus_fastapi_instrumentator import Instrumentator

from services.api.errors import error_answers
from services.api.key_gate import KeyGate
from services.api.routes_jobs import jobs_router
from services.api.unavailable import UNAVAILABLE, answer_unavailable
from services.api.validation_errors import validation_error_answer
from services.config import get_settings
from services.db.session import ping_database
from services.logs import configure_logging
from services.metrics import export_queue_depth_from_api
from services.queue.names import service_queues
from services.schemas.jobs import Readiness

log = structlog.get_logger(__name__)


def readiness() -> Readiness:
    checks: dict[str, str] = {}
    try:
        ping_database()
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"error: {type(exc).__name__}: {exc}"
    try:
        client = redis.Redis.from_url(get_settings().redis_url, socket_connect_timeout=2, socket_timeout=2)
        client.ping()
        checks["redis"] = "ok"
    except Exception as exc:
        checks["redis"] = f"error: {type(exc).__name__}: {exc}"
    return Readiness(ready=all(v == "ok" for v in checks.values()), checks=checks)


def create_service_app(service: str, *routers: APIRouter, description: str = "") -> FastAPI:
    configure_logging(service)
    exception_handlers: dict[int | type[Exception], Callable[[Request, Any], Coroutine[Any, Any, Response]]] = {
        RequestValidationError: validation_error_answer
    }
    exception_handlers |= {kind: answer_unavailable for kind in UNAVAILABLE}
    # /docs and /redoc with Swagger UI's and ReDoc's assets served by the service itself (fastapi-offline ships
    # them): the GPU hosts have no network, and FastAPI's own pages load them from a CDN.
    app = FastAPIOffline(
        title=f"KernelZero {service} service",
        version="0.1.0",
        description=description,
        max_body_size=get_settings().max_request_bytes,
        # A store away (Redis, the database) is a 503 with the reason and Retry-After, never a 500.
        exception_handlers=exception_handlers,
        # Operation ids are the route functions' names (score_group, request_kernel): stable across paths
        # and versions, so a client generated from the document keeps its method names.
        generate_unique_id_function=lambda route: route.name,
    )
    app.add_middleware(KeyGate)  # inside request_id (added after it), so its 401s carry a request id

    @app.middleware("http")
    async def request_id(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        rid = request.headers.get("x-request-id") or uuid.uuid4().hex
        structlog.contextvars.bind_contextvars(request_id=rid)
        try:
            response: Response = await call_next(request)
        finally:
            structlog.contextvars.unbind_contextvars("request_id")
        response.headers["x-request-id"] = rid
        return response

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        return {"status": "ok", "service": service}

    @app.get(
        "/readyz",
        tags=["health"],
        response_model=Readiness,
        responses={503: {"model": Readiness, "description": "the database or Redis does not answer"}},
    )
    def readyz() -> JSONResponse:
        state = readiness()
        return JSONResponse(state.model_dump(), status_code=200 if state.ready else 503)

    for router in (jobs_router(service), *routers):
        app.include_router(router, prefix="/v1", responses=error_answers(401, 413, 503))
    Instrumentator().instrument(app).expose(app, include_in_schema=False)
    export_queue_depth_from_api(service_queues(service, get_settings().gpu_devices))
    return app

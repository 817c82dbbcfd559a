"""503 for a store that does not answer. Redis or the database away is the platform's state, not the
request's fault: the answer says which store, why, and when to try again (``Retry-After``), never a 500.
Used by the app's exception handlers and by the key gate, a middleware those handlers do not reach."""

from __future__ import annotations

import kombu.exceptions
import redis
import structlog
from fastapi import Request
from fastapi.responses import JSONResponse
from sqlalchemy import exc as sa_exc

from services.queue.jobs import BrokerUnavailable

log = structlog.get_logger(__name__)

RETRY_AFTER_S = 5  # a restarted Redis or a database failing over is back within seconds


# The exceptions that mean a store is away (a connection refused, cut or timed out), not a bug: redis-py's
# and kombu's for Redis, SQLAlchemy's OperationalError and InterfaceError (a connection refused or lost) and
# its pool's TimeoutError for the database. An IntegrityError or a ProgrammingError is a bug and stays a 500.
UNAVAILABLE: tuple[type[Exception], ...] = (
    BrokerUnavailable,
    redis.RedisError,
    kombu.exceptions.OperationalError,
    sa_exc.OperationalError,
    sa_exc.InterfaceError,
    sa_exc.TimeoutError,
)


def unavailable_reason(exc: BaseException) -> str | None:
    """Why to answer 503 when ``exc`` says a store is away; None for any other exception. Which store, and
    the error's class: the error's text (hosts, ports, database names) goes to the log, not to a caller
    who may have no key yet (the key gate answers this too)."""
    if isinstance(exc, BrokerUnavailable):
        return (
            f"Redis does not answer ({type(exc.__cause__).__name__}); job {exc.job_id} is recorded and will be sent "
            "once Redis is back: send the request again to follow it"
        )
    if isinstance(exc, redis.RedisError | kombu.exceptions.OperationalError):
        return f"Redis does not answer ({type(exc).__name__})"
    if isinstance(exc, sa_exc.DBAPIError):
        return f"the database does not answer ({type(exc.orig).__name__})"
    if isinstance(exc, sa_exc.TimeoutError):
        return "the database does not answer (no connection free in the pool)"
    return None


def unavailable_answer(exc: BaseException) -> JSONResponse:
    """503 with the reason and ``Retry-After``; the error itself in the service's log."""
    reason = unavailable_reason(exc) or f"a store does not answer ({type(exc).__name__})"
    log.warning("request.store_unavailable", reason=reason, error=f"{type(exc).__name__}: {exc}".splitlines()[0])
    return JSONResponse({"detail": reason}, status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)})


async def answer_unavailable(request: Request, exc: Exception) -> JSONResponse:
    """The exception handler for ``UNAVAILABLE``."""
    return unavailable_answer(exc)

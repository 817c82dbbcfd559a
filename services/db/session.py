"""Engines and sessions. SQLite gets WAL and a busy timeout: several processes share the file; PostgreSQL's
pool checks a connection before lending it (``pool_pre_ping``), so one the server cut is replaced. A worker's
job bookkeeping and body wait for a database that is away (``until_database_answers``) instead of failing."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, ParamSpec, TypeVar

import structlog
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.orm import Session
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_delay, wait_exponential

from services.config import get_settings

log = structlog.get_logger(__name__)
P = ParamSpec("P")
T = TypeVar("T")


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        return engine
    return create_engine(url, pool_pre_ping=True)


@lru_cache
def engine_for(url: str) -> Engine:
    return make_engine(url)


def get_engine() -> Engine:
    return engine_for(get_settings().sqlalchemy_url)


@contextmanager
def session_scope() -> Iterator[Session]:
    """A transaction: commit on success, roll back on error."""
    # A Session, not a sessionmaker per call: each sessionmaker makes a Session subclass, and SQLAlchemy sets up
    # event dispatch for every new class (under load on the reward API that was a fifth of its CPU).
    session = Session(bind=get_engine(), expire_on_commit=False)
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def ping_database() -> None:
    with get_engine().connect() as conn:
        conn.execute(text("SELECT 1"))


def database_away(exc: BaseException) -> bool:
    """Whether ``exc`` says the database is out of reach (a connection refused, cut or timed out, SQLite's
    file locked past its busy timeout), not that the statement is wrong: an IntegrityError is no reason to
    try again."""
    if isinstance(exc, sa_exc.DBAPIError):
        return exc.connection_invalidated or isinstance(exc, sa_exc.OperationalError | sa_exc.InterfaceError)
    return isinstance(exc, sa_exc.TimeoutError)  # the pool had no connection to lend in time


def _log_retry(state: RetryCallState) -> None:
    error = state.outcome.exception() if state.outcome else None
    log.warning(
        "database.away",
        retrying=getattr(state.fn, "__qualname__", "work"),
        attempt=state.attempt_number,
        waited_s=round(state.seconds_since_start or 0.0, 2),
        error=f"{type(error).__name__}: {error}".splitlines()[0],
    )


def until_database_answers() -> Retrying:
    """A tenacity ``Retrying`` that calls again what failed because the database is away (``database_away``),
    after 0.1 s doubling up to 5 s, for up to ``KZ_DATABASE_RETRY_S``; then the error stands. Only for what
    may run twice: conditioned updates, writes keyed by the job, a job body whose effects are."""
    return Retrying(
        retry=retry_if_exception(database_away),
        wait=wait_exponential(multiplier=0.1, max=5),
        stop=stop_after_delay(get_settings().database_retry_s),
        before_sleep=_log_retry,
        reraise=True,
    )


def retry_while_database_away(function: Callable[P, T]) -> Callable[P, T]:
    """``function`` called through ``until_database_answers``."""

    @functools.wraps(function)
    def retried(*args: P.args, **kwargs: P.kwargs) -> T:
        return until_database_answers()(function, *args, **kwargs)

    return retried

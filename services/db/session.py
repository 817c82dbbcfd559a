"""Engines and sessions. SQLite gets WAL and a busy timeout: several processes share the file."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.orm import Session

from services.config import get_settings


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

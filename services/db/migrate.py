"""Run Alembic migrations programmatically (used by ``kernelzero up``, ``kernelzero db`` and tests)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from services.config import get_settings

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
# pg_advisory_lock's key for "a migration is running" (any fixed 64-bit number; this one spells KZMIGRAT).
MIGRATION_LOCK_KEY = 0x4B5A4D4947524154


def alembic_config(url: str | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", (url or get_settings().sqlalchemy_url).replace("%", "%%"))
    return config


@contextlib.contextmanager
def migration_lock(url: str) -> Iterator[None]:
    """One migration at a time per PostgreSQL database: every pod of a deployment runs ``kernelzero db
    upgrade`` as its init step, and those start together. The first takes the lock and migrates; the
    others wait, then find the schema at head and do nothing. (SQLite is one machine's: ``kernelzero up``.)"""
    if not make_url(url).get_backend_name().startswith("postgresql"):
        yield
        return
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK_KEY})
    finally:
        engine.dispose()


def upgrade(url: str | None = None, revision: str = "head") -> None:
    target = url or get_settings().sqlalchemy_url
    with migration_lock(target):
        command.upgrade(alembic_config(target), revision)


def downgrade(url: str | None = None, revision: str = "base") -> None:
    command.downgrade(alembic_config(url), revision)

"""Run Alembic migrations programmatically (used by ``kernelzero up``, ``kernelzero db`` and tests)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from services.config import get_settings

MIGRATIONS_DIR = Path(__file__).with_name("migrations")


def alembic_config(url: str | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", (url or get_settings().sqlalchemy_url).replace("%", "%%"))
    return config


def upgrade(url: str | None = None, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str | None = None, revision: str = "base") -> None:
    command.downgrade(alembic_config(url), revision)

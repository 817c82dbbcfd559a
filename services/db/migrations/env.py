"""Alembic environment: the URL comes from the caller's config or the platform settings."""

from __future__ import annotations

from alembic import context

from services.config import get_settings
from services.db.models import Base
from services.db.session import make_engine

config = context.config
url = config.get_main_option("sqlalchemy.url") or get_settings().sqlalchemy_url
engine = make_engine(url)

with engine.connect() as connection:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=url.startswith("sqlite"),
    )
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()

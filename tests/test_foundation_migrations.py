"""Alembic migrations go up and down on SQLite and on the real PostgreSQL, and match the models."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, select, text
from sqlalchemy.orm import Session

from services.config import Settings
from services.db import migrate
from services.db.models import ApiKey, Base, Job
from services.db.session import make_engine


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'migrations.db'}"
    # its own database: the session's may already hold tables that other tests in this process migrated
    return request.getfixturevalue("private_postgres_url")


def user_tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_migrations_up_and_down(database_url: str, kz_env: Callable[..., Settings]) -> None:
    kz_env()
    model_tables = set(Base.metadata.tables)
    assert model_tables == {
        "api_keys",
        "jobs",
        "job_checkpoints",
        "tasks",
        "candidates",
        "scores",
        "rollouts",
        "rollout_groups",
        "model_versions",
        "api_corpora",
        "api_usage",
        "api_pairs",
        "training_runs",
        "training_records",
    }
    assert user_tables(database_url) == set()

    migrate.upgrade(database_url)
    assert user_tables(database_url) == model_tables
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            drift = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        assert drift == [], f"the models differ from the migrated schema (write a migration): {drift}"
        with Session(engine) as session:  # JSON columns and timestamps round-trip on this dialect
            session.add(Job(id="j1", kind="k", queue="q", idempotency_key="a" * 64, payload={"n": [1, 2]}))
            session.commit()
            job = session.get(Job, "j1")
            assert job is not None and job.payload == {"n": [1, 2]} and job.attempts == 0 and job.created_at
    finally:
        engine.dispose()

    migrate.downgrade(database_url)
    assert user_tables(database_url) == set()
    migrate.upgrade(database_url)  # a downgraded database upgrades again
    assert user_tables(database_url) == model_tables
    migrate.downgrade(database_url)
    assert user_tables(database_url) == set()


def test_keys_made_before_admin_scopes_keep_their_access(database_url: str, kz_env: Callable[..., Settings]) -> None:
    kz_env()
    migrate.upgrade(database_url, "0002")
    engine = make_engine(database_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO api_keys (id, name, prefix, key_hash, created_at) "
                    "VALUES ('old', 'ci', 'kz_old', :hash, CURRENT_TIMESTAMP)"
                ),
                {"hash": "a" * 64},
            )
        migrate.upgrade(database_url)
        with Session(engine) as session:
            session.add(ApiKey(id="new", name="later", prefix="kz_new", key_hash="b" * 64))
            session.commit()
            admin = {key.id: key.admin for key in session.scalars(select(ApiKey))}
        assert admin == {"old": True, "new": False}
    finally:
        engine.dispose()
        migrate.downgrade(database_url)


def test_concurrent_jobs_storing_one_source_share_its_task(database_url: str, kz_env: Callable[..., Settings]) -> None:
    """Groups for the same reference finish at once on a threads-pool worker: one row, one id for all."""
    from concurrent.futures import ThreadPoolExecutor

    from services.db.models import Task
    from services.db.tasks import ensure_task

    kz_env(database_url=database_url)
    migrate.upgrade(database_url)
    try:
        with ThreadPoolExecutor(6) as pool:
            ids = list(pool.map(lambda _: ensure_task("class Model: ...", origin="external"), range(12)))
        engine = make_engine(database_url)
        with Session(engine) as session:
            rows = list(session.scalars(select(Task)))
        engine.dispose()
        assert len(set(ids)) == 1 and [t.id for t in rows] == ids[:1] and rows[0].origin == "external"
    finally:
        migrate.downgrade(database_url)

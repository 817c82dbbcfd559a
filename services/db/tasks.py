"""Tasks shared by the services: one row per module source, whoever stores it first."""

from __future__ import annotations

import hashlib

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from services.db.models import Task
from services.db.session import session_scope


def source_sha256(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def ensure_task(source: str, origin: str) -> str:
    """The id of the source's task, stored as a reference with ``origin`` if it is new. Safe when
    several jobs store the same source at once: the first insert wins, the others read its row."""
    digest = source_sha256(source)
    try:
        with session_scope() as session:
            task = session.scalars(select(Task).where(Task.source_hash == digest)).first()
            if task is None:
                task = Task(source=source, source_hash=digest, origin=origin, status="reference")
                session.add(task)
                session.flush()
            return task.id
    except IntegrityError:  # a concurrent job stored the same source between our read and our insert
        with session_scope() as session:
            return session.scalars(select(Task.id).where(Task.source_hash == digest)).one()

"""Which model version each role serves (``coder``, ``proposer``): rows of ``model_versions``, at most
one serving per role. A role's ``POST /v1/admin/model`` switches it; the role's workers read it at the
start of every job, so a switch reaches the next job without a restart. Roles never touch each
other's rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import structlog
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from services.db.models import ModelVersion
from services.db.session import session_scope
from services.schemas.serving import ModelBackend, ModelSwitch, ServingModel

log = structlog.get_logger(__name__)

Role = Literal["coder", "proposer"]


@dataclass(frozen=True)
class ServingVersion:
    id: str
    name: str
    base_model: str | None
    adapter_path: str | None


def serving_version(role: Role) -> ServingVersion | None:
    with session_scope() as session:
        row = _serving_row(session, role)
        return ServingVersion(row.id, row.name, row.base_model, row.adapter_path) if row else None


def switch_model(role: Role, switch: ModelSwitch, backend: ModelBackend) -> ServingModel:
    """Make this version the only one ``role`` serves (recorded once: switching back to a version, or
    again to the same one, keeps its record and id)."""
    with session_scope() as session:
        session.execute(update(ModelVersion).where(ModelVersion.role == role).values(serving=False))
        row = session.scalars(
            select(ModelVersion).where(
                ModelVersion.role == role,
                ModelVersion.name == switch.name,
                ModelVersion.base_model.is_not_distinct_from(switch.base_model),
                ModelVersion.adapter_path.is_not_distinct_from(switch.adapter_path),
            )
        ).first()
        if row is None:
            row = ModelVersion(role=role, name=switch.name, base_model=switch.base_model, adapter_path=switch.adapter_path)
            session.add(row)
        row.serving = True
        session.flush()
        log.info("model_switched", role=role, version=row.id, name=row.name, adapter=row.adapter_path)
        return _described(row, backend)


def serving_model(role: Role, configured: ServingModel) -> ServingModel:
    """The version ``role`` serves, on the configured backend; ``configured`` while none was switched to."""
    with session_scope() as session:
        row = _serving_row(session, role)
        return _described(row, configured.backend) if row else configured


def _serving_row(session: Session, role: Role) -> ModelVersion | None:
    return session.scalars(
        select(ModelVersion)
        .where(ModelVersion.role == role, ModelVersion.serving.is_(True))
        .order_by(ModelVersion.created_at.desc())
    ).first()


def _described(row: ModelVersion, backend: ModelBackend) -> ServingModel:
    return ServingModel(
        id=row.id,
        name=row.name,
        base_model=row.base_model,
        adapter_path=row.adapter_path,
        backend=backend,
        created_at=row.created_at,
    )

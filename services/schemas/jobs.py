from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from services.schemas.numbers import StrictFiniteFloat
from services.schemas.times import UTCDatetime

JobStatus = Literal["queued", "running", "succeeded", "failed"]
FINISHED: tuple[JobStatus, ...] = ("succeeded", "failed")


class JobOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    kind: str
    queue: str
    status: JobStatus
    attempts: int
    result: dict[str, Any] | None = None
    error: str | None = None
    created_at: UTCDatetime
    started_at: UTCDatetime | None = None
    finished_at: UTCDatetime | None = None


class ProbeIn(BaseModel):
    """A diagnostic job: proves the service's queue and worker are alive."""

    token: str = Field(description="Any string; the same token is the same job (idempotent).", max_length=200)
    sleep_s: StrictFiniteFloat = Field(default=0.0, ge=0, le=600)


class Readiness(BaseModel):
    ready: bool
    checks: dict[str, str]

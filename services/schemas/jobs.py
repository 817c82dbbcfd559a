from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from services.schemas.numbers import StrictFiniteFloat
from services.schemas.times import UTCDatetime

JobStatus = Literal["queued", "running", "succeeded", "failed"]
FINISHED: tuple[JobStatus, ...] = ("succeeded", "failed")


class JobOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str = Field(description="The job's id; the same request body gives the same id (jobs are idempotent).")
    kind: str = Field(description="What the job does (the Celery task's name), e.g. reward.score_group.")
    queue: str = Field(description="The queue it was sent to, e.g. score.cpu or generation.")
    status: JobStatus = Field(description="queued, running, succeeded or failed; the last two are final.")
    attempts: int = Field(description="Deliveries so far (a job whose worker died is sent again, up to KZ_MAX_JOB_ATTEMPTS).")
    result: dict[str, Any] | None = Field(
        None, description="The job's answer once it succeeded (the shape of the route that submitted it); None before."
    )
    error: str | None = Field(None, description="Why the job failed, in words; None unless status is failed.")
    created_at: UTCDatetime = Field(description="When the job was submitted (UTC, with offset).")
    started_at: UTCDatetime | None = Field(None, description="When a worker first took it; None while queued.")
    finished_at: UTCDatetime | None = Field(None, description="When it reached a final state; None before.")


class ProbeIn(BaseModel):
    """A diagnostic job: proves the service's queue and worker are alive."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"token": "hello", "sleep_s": 0}]})

    token: str = Field(description="Any string; the same token is the same job (idempotent).", max_length=200)
    sleep_s: StrictFiniteFloat = Field(
        default=0.0,
        ge=0,
        le=600,
        description="Seconds the probe job sleeps on the worker before it succeeds (to test waiting and polling).",
    )


class Readiness(BaseModel):
    ready: bool = Field(description="True when every dependency answers; the HTTP status is then 200, else 503.")
    checks: dict[str, str] = Field(description="Each dependency (database, redis) and 'ok' or the error it gave.")

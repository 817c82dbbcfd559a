"""Trainer API schemas: a run of the alternating loop as it stands, with its figures.

A run's configuration is ``trainer.config.LoopConfig`` (the trainer's routes validate it); here it
travels as the mapping it was stored as, so the shared layer needs nothing of the trainer."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from services.schemas.times import UTCDatetime

RunStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]


class RecordOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    kind: Literal["step", "round"]
    role: Literal["coder", "proposer"] = Field(description="Whose half of the round: the Coder's or the Proposer's.")
    round: int = Field(description="0-based round.")
    step: int | None = Field(None, description="0-based optimizer step within the round; None for a round's row.")
    metrics: dict[str, Any]


class RunOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    status: RunStatus
    config: dict[str, Any]
    run_dir: str = Field(description="Where records.jsonl and curves.png are written, as the trainer's workers see it.")
    rounds_done: int = Field(description="Rounds trained and published: where a restarted run resumes.")
    coder_version_id: str | None = Field(None, description="The Coder version the run published last.")
    proposer_version_id: str | None = Field(None, description="The Proposer version the run published last.")
    cancel_requested: bool
    error: str | None = None
    created_at: UTCDatetime
    started_at: UTCDatetime | None = None
    finished_at: UTCDatetime | None = None
    records: list[RecordOut] = Field(default_factory=list)

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

    kind: Literal["step", "round"] = Field(description="step (one optimizer step) or round (a whole round's figures).")
    role: Literal["coder", "proposer"] = Field(description="Whose half of the round: the Coder's or the Proposer's.")
    round: int = Field(description="0-based round.")
    step: int | None = Field(None, description="0-based optimizer step within the round; None for a round's row.")
    metrics: dict[str, Any] = Field(description="The figures: loss, reward, pass rate, seconds and the like, by name.")


class RunOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str = Field(description="The run's id.")
    status: RunStatus = Field(description="queued, running, succeeded, failed or cancelled.")
    config: dict[str, Any] = Field(description="The run's LoopConfig as submitted.")
    run_dir: str = Field(description="Where records.jsonl and curves.png are written, as the trainer's workers see it.")
    rounds_done: int = Field(description="Rounds trained and published: where a restarted run resumes.")
    coder_version_id: str | None = Field(None, description="The Coder version the run published last.")
    proposer_version_id: str | None = Field(None, description="The Proposer version the run published last.")
    cancel_requested: bool = Field(description="DELETE was called: the run stops at its next task or step.")
    error: str | None = Field(None, description="Why the run failed; None unless it failed.")
    created_at: UTCDatetime = Field(description="When the run was submitted.")
    started_at: UTCDatetime | None = Field(None, description="When its first round started; None while queued.")
    finished_at: UTCDatetime | None = Field(None, description="When it reached a final state; None before.")
    records: list[RecordOut] = Field(default_factory=list, description="Every step's and round's figures, oldest first.")

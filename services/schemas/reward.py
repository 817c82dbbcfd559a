"""Reward API schemas: what other RL pipelines, CI plugins and our own services send and get."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from reward_svc.rewards import CAGRPOConfig

MAX_SOURCE_CHARS = 200_000
VerdictStatus = Literal["correct", "incorrect", "compile_error", "runtime_error", "timeout", "rejected", "unverified"]


class ScoreOptions(BaseModel):
    backend: Literal["cuda", "triton"] = "triton"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    trials: int = Field(3, ge=1, le=20, description="Correctness trials, each with fresh secret inputs.")
    atol: float | None = Field(None, gt=0, description="Default: KernelBench's (fp32 1e-4, fp16/bf16 1e-2).")
    rtol: float | None = Field(None, gt=0)
    timeout_s: float = Field(180.0, gt=0, le=3600, description="Wall-clock limit of each sandboxed child.")
    measure_speed: bool = True
    time_compiled: bool = Field(False, description="Also time the reference under torch.compile.")


class ScoreRequest(BaseModel):
    reference: str = Field(..., min_length=1, max_length=MAX_SOURCE_CHARS, description="KernelBench reference: Model, get_inputs, get_init_inputs.")
    candidate: str = Field(..., min_length=1, max_length=MAX_SOURCE_CHARS, description="KernelBench candidate: ModelNew.")
    options: ScoreOptions = ScoreOptions()
    wait_s: float = Field(60.0, ge=0, le=600, description="How long to wait for the verdict before answering with the job id.")


class GroupScoreRequest(BaseModel):
    reference: str = Field(..., min_length=1, max_length=MAX_SOURCE_CHARS)
    candidates: list[Annotated[str, Field(min_length=1, max_length=MAX_SOURCE_CHARS)]] = Field(..., min_length=1, max_length=64)
    options: ScoreOptions = ScoreOptions()
    ca_grpo: CAGRPOConfig = CAGRPOConfig()
    wait_s: float = Field(60.0, ge=0, le=600)


class VerdictOut(BaseModel):
    status: VerdictStatus
    correct: bool
    reason: str
    guard: str | None = None
    reward: float
    advantage: float | None = None
    speedup: float | None = None
    runtime_ms: float | None = None
    ref_runtime_ms: float | None = None
    max_abs_error: float | None = None
    device: str | None = None
    details: dict[str, Any] = Field(default_factory=dict)


class GroupResult(BaseModel):
    verdicts: list[VerdictOut]
    correct_fraction: float
    speed_rewarded: bool


class ScoreResponse(BaseModel):
    job_id: str
    job_status: str
    verdict: VerdictOut | None = None
    error: str | None = None


class GroupScoreResponse(BaseModel):
    job_id: str
    job_status: str
    result: GroupResult | None = None
    error: str | None = None

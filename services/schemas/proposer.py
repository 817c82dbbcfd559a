"""Proposer API schemas: proposing tasks, reading the task pool, the frontier."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from services.llm.chat import Message, SampledTokens
from services.schemas.numbers import StrictFiniteFloat
from services.schemas.times import UTCDatetime

ComposerName = Literal["composer", "llm"]
TaskStatus = Literal["pending", "valid", "rejected", "reference"]


class ProposeRequest(BaseModel):
    count: StrictInt = Field(
        ..., ge=1, le=500, description="Modules to propose (each is validated; rejected ones are stored too)."
    )
    backend: ComposerName | None = Field(
        None, description="Who composes: the programmatic composer or the LLM; default KZ_PROPOSER_COMPOSER."
    )
    difficulty: StrictFiniteFloat = Field(
        0.5, ge=0, le=1, description="0: few ops, small tensors .. 1: long chains, larger tensors."
    )
    max_ops: StrictInt = Field(6, ge=1, le=32, description="Upper bound on operations per module.")
    api_set_size: StrictInt | None = Field(
        None, ge=1, le=16, description="APIs sampled per module; default KZ_PROPOSER_API_SET_SIZE."
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="Where validation runs the modules.")
    group_size: StrictInt = Field(
        1,
        ge=1,
        le=64,
        description="Modules sampled from each API set's prompt (the llm composer). Above 1, each API set is a Proposer RL "
        "group: count API sets, group_size samples each, every sample kept as drawn (no retry), with its reply's tokens.",
    )
    temperature: StrictFiniteFloat | None = Field(
        None, ge=0, le=2, description="The llm composer's sampling temperature; default 0.8."
    )
    max_tokens: StrictInt | None = Field(None, ge=1, le=65536, description="The llm composer's longest reply; default 2048.")
    seed: StrictInt | None = Field(
        None, ge=0, lt=2**63, description="Same seed, same request: same job. None draws a fresh seed."
    )
    wait_s: StrictFiniteFloat = Field(0.0, ge=0, le=600, description="How long to wait for the job before answering with its id.")


class SampledReply(BaseModel):
    """A Proposer reply as the sampler drew it, what training needs: its text and, where the backend
    gave them, its token ids and their log-probabilities."""

    text: str
    model_version: str | None = None
    tokens: SampledTokens | None = None


class ProposalOut(BaseModel):
    """What became of one proposal."""

    task_id: str | None = Field(None, description="The stored task; None when the composer declined or the exact source exists.")
    status: Literal["valid", "rejected", "declined", "exists"]
    reason: str
    rule: str | None = None
    api_set: list[str]
    group: int | None = Field(None, description="With group_size > 1: the API set's group (its index in ProposeSummary.prompts).")
    reply: SampledReply | None = Field(None, description="With group_size > 1: the composer's reply, as sampled.")


class ProposeSummary(BaseModel):
    requested: int
    valid: int
    rejected: int
    declined: int = Field(description="API sets the composer could not build a module from.")
    exists: int = Field(description="Exact sources already in the pool (not stored again).")
    reasons: dict[str, int] = Field(description="Rejections per validation rule.")
    apis_covered: int = Field(description="Distinct APIs in the valid modules' API sets.")
    pairs_covered: int
    corpus: str | None = Field(description="The mined statistics sampled from; None: uniform sampling.")
    seconds: float
    proposals: list[ProposalOut]
    prompts: list[list[Message]] = Field(
        default_factory=list, description="With group_size > 1: per group, the conversation each of its samples answers."
    )


class ProposeResponse(BaseModel):
    job_id: str
    job_status: str
    result: ProposeSummary | None = None
    error: str | None = None


class TaskOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    source: str
    source_hash: str
    origin: str
    api_set: list[str] | None = None
    input_shapes: list[Any] | None = None
    status: str
    reason: str | None = None
    graph_hash: str | None = None
    details: dict[str, Any] | None = None
    created_at: UTCDatetime


class TaskPage(BaseModel):
    items: list[TaskOut]
    total: int
    limit: int
    offset: int


class FrontierTaskOut(BaseModel):
    task_id: str
    pass_rate: float | None = Field(description="Correct verdicts / scored verdicts; None: never scored.")
    attempts: int
    reward: float | None = Field(description="Frontier reward; None while attempts are below the minimum.")
    explored: bool = Field(description="Chosen to be measured (too few attempts), not for sitting on the frontier.")
    api_set: list[str] | None = None


class FrontierOut(BaseModel):
    shape: Literal["linear", "gaussian"]
    width: float
    min_attempts: int
    pool_tasks: int = Field(description="Valid and reference tasks.")
    scored_tasks: int = Field(description="Pool tasks with at least min_attempts verdicts.")
    bin_edges: list[float]
    histogram: list[int] = Field(description="Scored tasks per pass-rate bin (the last bin includes 1.0).")
    tasks: list[FrontierTaskOut] = Field(description="The next round's selection, frontier first, then exploration.")

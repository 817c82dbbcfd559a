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
    model_config = ConfigDict(json_schema_extra={"examples": [{"count": 8, "wait_s": 60}]})

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

    text: str = Field(description="The composer's whole reply.")
    model_version: str | None = Field(None, description="The served model version that wrote it; None for the configured model.")
    tokens: SampledTokens | None = Field(None, description="The reply's token ids and log-probabilities, for training.")


class ProposalOut(BaseModel):
    """What became of one proposal."""

    task_id: str | None = Field(None, description="The stored task; None when the composer declined or the exact source exists.")
    status: Literal["valid", "rejected", "declined", "exists"] = Field(
        description="valid (stored), rejected (by validation), declined (no module written) or exists (already in the pool)."
    )
    reason: str = Field(description="Why this status, in words.")
    rule: str | None = Field(None, description="The validation rule that rejected it; None otherwise.")
    api_set: list[str] = Field(description="The Torch APIs the module was asked to combine.")
    group: int | None = Field(None, description="With group_size > 1: the API set's group (its index in ProposeSummary.prompts).")
    reply: SampledReply | None = Field(None, description="With group_size > 1: the composer's reply, as sampled.")


class ProposeSummary(BaseModel):
    requested: int = Field(description="Modules asked for.")
    valid: int = Field(description="Modules that passed validation and were stored.")
    rejected: int = Field(description="Modules validation turned down.")
    declined: int = Field(description="API sets the composer could not build a module from.")
    exists: int = Field(description="Exact sources already in the pool (not stored again).")
    reasons: dict[str, int] = Field(description="Rejections per validation rule.")
    apis_covered: int = Field(description="Distinct APIs in the valid modules' API sets.")
    pairs_covered: int = Field(description="Distinct API pairs in the valid modules' API sets.")
    corpus: str | None = Field(description="The mined statistics sampled from; None: uniform sampling.")
    seconds: float = Field(description="Wall time of the round.")
    proposals: list[ProposalOut] = Field(description="Every proposal with its status and reason.")
    prompts: list[list[Message]] = Field(
        default_factory=list, description="With group_size > 1: per group, the conversation each of its samples answers."
    )


class ProposeResponse(BaseModel):
    job_id: str = Field(description="The proposal job; GET /v1/jobs/{job_id} reads it while it runs.")
    job_status: str = Field(description="queued, running, succeeded or failed; result is set once succeeded.")
    result: ProposeSummary | None = Field(None, description="The round's summary; None until the job succeeded.")
    error: str | None = Field(None, description="Why the job failed; None unless it failed.")


class TaskOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str = Field(description="The task's id.")
    source: str = Field(description="The module's source (KernelBench format).")
    source_hash: str = Field(description="SHA-256 of the source: the same module is one task.")
    origin: str = Field(description="Who wrote it: composer, llm:<version>, external (a scoring request) or reference.")
    api_set: list[str] | None = Field(None, description="The Torch APIs it combines, where it was composed from a set.")
    input_shapes: list[Any] | None = Field(None, description="Shapes of get_inputs()'s tensors, as validation saw them.")
    status: str = Field(description="valid, rejected or reference.")
    reason: str | None = Field(None, description="Why validation rejected it; None otherwise.")
    graph_hash: str | None = Field(None, description="Hash of the module's traced graph: near-duplicates share it.")
    details: dict[str, Any] | None = Field(None, description="What validation measured (runtimes, ops).")
    created_at: UTCDatetime = Field(description="When it joined the pool.")


class TaskPage(BaseModel):
    items: list[TaskOut] = Field(description="This page's tasks, newest first.")
    total: int = Field(description="Tasks matching the filters, over all pages.")
    limit: int = Field(description="Page size asked for.")
    offset: int = Field(description="Tasks skipped before this page.")


class FrontierTaskOut(BaseModel):
    task_id: str = Field(description="The task's id.")
    pass_rate: float | None = Field(description="Correct verdicts / scored verdicts; None: never scored.")
    attempts: int = Field(description="Scored verdicts on the task.")
    reward: float | None = Field(description="Frontier reward; None while attempts are below the minimum.")
    explored: bool = Field(description="Chosen to be measured (too few attempts), not for sitting on the frontier.")
    api_set: list[str] | None = Field(None, description="The Torch APIs it combines, where known.")


class FrontierOut(BaseModel):
    shape: Literal["linear", "gaussian"] = Field(description="The frontier reward's shape: linear or gaussian.")
    width: float = Field(description="Standard deviation of the gaussian shape.")
    min_attempts: int = Field(description="Scored verdicts before a task's pass rate counts.")
    pool_tasks: int = Field(description="Valid and reference tasks.")
    scored_tasks: int = Field(description="Pool tasks with at least min_attempts verdicts.")
    bin_edges: list[float] = Field(description="Edges of the pass-rate histogram's bins.")
    histogram: list[int] = Field(description="Scored tasks per pass-rate bin (the last bin includes 1.0).")
    tasks: list[FrontierTaskOut] = Field(description="The next round's selection, frontier first, then exploration.")

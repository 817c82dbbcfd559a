"""Coder API schemas: ask for a kernel, read the best one with every candidate's verdict (switching the
model: ``services.schemas.serving``)."""

from __future__ import annotations

import ast
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator

from services.llm.chat import SampledTokens, Sampling
from services.schemas.examples import RELU_REFERENCE
from services.schemas.numbers import StrictFiniteFloat
from services.schemas.reward import MAX_SOURCE_CHARS, ScoredVerdict
from services.schemas.serving import ModelBackend

KernelBackendName = Literal["cuda", "triton"]


class ScoringIn(BaseModel):
    """How the reward service checks the candidates (the kernel backend comes from the request)."""

    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Where the reward service runs the candidates: cpu, cuda, or auto."
    )
    trials: StrictInt = Field(3, ge=1, le=20, description="Correctness trials, each with fresh secret inputs.")
    timeout_s: StrictFiniteFloat = Field(180.0, gt=0, le=3600, description="Wall-clock limit of each sandboxed child.")
    measure_speed: bool = Field(True, description="Time the candidates (GPU only), so the fastest correct one wins.")


class KernelRequest(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"module": RELU_REFERENCE, "backend": "triton", "n": 4, "wait_s": 60}]}
    )

    module: str = Field(
        ..., min_length=1, max_length=MAX_SOURCE_CHARS, description="KernelBench module: Model, get_inputs, get_init_inputs."
    )
    backend: KernelBackendName = Field("triton", description="Kernel language to write: triton or cuda.")
    n: StrictInt = Field(4, ge=1, le=64, description="Candidates to generate; the best verified one is returned.")
    wait_s: StrictFiniteFloat = Field(
        60.0, ge=0, le=600, description="How long to wait for the result before answering with the job id."
    )
    model_backend: ModelBackend | None = Field(None, description="Override the service's model backend for this request.")
    sampling: Sampling = Field(Sampling(), description="Fields left out take the service's defaults; n is the request's.")
    scoring: ScoringIn = Field(ScoringIn(), description="How the reward service checks the candidates.")

    @field_validator("module")
    @classmethod
    def _kernelbench_module(cls, source: str) -> str:
        """Parsed, never run: a module the reward service could not load is refused here with the reason."""
        try:
            tree = ast.parse(source)
        except SyntaxError as exc:
            raise ValueError(f"module is not valid Python: {exc.msg} (line {exc.lineno})") from None
        except (RecursionError, MemoryError, ValueError) as exc:
            raise ValueError(f"module cannot be parsed: {type(exc).__name__}") from None
        names = {node.name for node in tree.body if isinstance(node, (ast.ClassDef, ast.FunctionDef))}
        missing = [name for name in ("Model", "get_inputs") if name not in names]
        if missing:
            raise ValueError(f"module must define {' and '.join(missing)} at top level (KernelBench format)")
        return source


class CandidateReport(BaseModel):
    """One generated candidate: its source and verdict, or why there was nothing to score."""

    index: int = Field(description="The candidate's position among the n generated.")
    model: str = Field(description="The generator that wrote it (llm:<backend> or template).")
    model_version: str | None = Field(None, description="The served model version that wrote it; None for the configured model.")
    source: str | None = Field(None, description="The extracted ModelNew program; None when the reply held none.")
    declined: str | None = Field(None, description="Why the generator produced no kernel (not scored).")
    verdict: ScoredVerdict | None = Field(None, description="The reward service's verdict; None when there was nothing to score.")
    details: dict[str, Any] = Field(
        default_factory=dict, description="What the generator recorded (prompt, finish reason, its own notes)."
    )
    reply: str | None = Field(None, description="The model's whole reply, where the sampling asked for tokens (training).")
    tokens: SampledTokens | None = Field(None, description="The reply's token ids and the sampler's log-probabilities.")


class JobSeconds(BaseModel):
    """Where a generation job's time went: the model writing, the reward service judging."""

    sample: float = Field(description="Seconds the model took to write the candidates.")
    score: float = Field(description="Seconds from handing the candidates to the scorer to their verdicts (0: none had code).")


class KernelResult(BaseModel):
    correct: bool = Field(description="Whether any candidate was verified correct.")
    kernel: str | None = Field(None, description="The best verified kernel's source; None when no candidate was correct.")
    best_index: int | None = Field(None, description="Index of the winning candidate in candidates; None when none was correct.")
    speedup: float | None = Field(None, description="None where speed was not measured (no GPU).")
    reason: str = Field(description="Why this result: the winner's verdict, or why no candidate passed.")
    model: str = Field(description="The generator that wrote the candidates.")
    backend: KernelBackendName = Field(description="The kernels' language.")
    candidates: list[CandidateReport] = Field(description="Every candidate with its verdict or why it was not scored.")
    correct_fraction: float = Field(description="Share of scored candidates judged correct.")
    reward_job_id: str | None = Field(
        None, description="The reward service's scoring job for the candidates; None when none had code."
    )
    model_version_id: str | None = Field(None, description="The serving model version the job used, if one was recorded.")
    prompt: list[dict[str, str]] | None = Field(
        None, description="The chat messages the drafts were sampled from, once (an LLM backend; the template has none)."
    )
    seconds: JobSeconds | None = Field(None, description="Where the job's time went.")


class KernelResponse(BaseModel):
    job_id: str = Field(description="The generation job; GET /v1/kernels/{job_id} reads it while it runs.")
    job_status: str = Field(description="queued, running, succeeded or failed; result is set once succeeded.")
    result: KernelResult | None = Field(
        None, description="The best kernel and every candidate's verdict; None until the job succeeded."
    )
    error: str | None = Field(None, description="Why the job failed; None unless it failed.")

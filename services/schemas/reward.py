"""Reward API schemas: what other RL pipelines, CI plugins and our own services send and get."""

from __future__ import annotations

from dataclasses import field
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, StrictInt, TypeAdapter, computed_field
from pydantic.dataclasses import dataclass

from services.schemas.numbers import StrictFiniteFloat

MAX_SOURCE_CHARS = 200_000
VerdictStatus = Literal["correct", "incorrect", "compile_error", "runtime_error", "timeout", "rejected", "unverified"]
# The checks that reject a candidate (docs/REWARD.md has each one's hack class, mechanism and tests).
Guard = Literal[
    # before anything runs: the capability policy on its source
    "forbidden_import",
    "forbidden_call",
    "harness_tampering",
    "precision_downgrade",
    "pytorch_fallback",
    # in its child: the native policy, launches, what forward did to its inputs and outputs
    "native_policy",
    "exception_fallback",
    "no_custom_kernel",
    "conditional_fallback",
    "host_compute",
    "input_mutation",
    "late_write",
    "background_thread",
    # the judge, from the output files and what the child recorded
    "output_tampering",
    "cross_call_cache",
    "decoy_kernel",
    "kernel_share",
    "knockout_evasion",
    "timing_evasion",
]
GUARDS: frozenset[str] = frozenset(get_args(Guard))


class CAGRPOConfig(BaseModel):
    """Correctness-aware group rewards: ``r_i = correct_i + T·speed_weight·S_i``, ``T`` on once the
    group's correct fraction reaches ``threshold`` (``speed_reward="threshold"``; the source's
    ablations are ``"never"`` and ``"always"``). The source's own form is ``speed_score="speedup"``
    (``S_i`` the speedup itself, optionally capped) with ``speed_weight=0.1``."""

    threshold: StrictFiniteFloat = Field(0.5, ge=0, le=1, description="α: group correct fraction from which speed counts.")
    speed_weight: StrictFiniteFloat = Field(0.5, ge=0, description="β (λ): weight of the speed score.")
    speed_score: Literal["log_speedup", "rank", "speedup"] = Field(
        "log_speedup", description="S_i: clipped log-speedup (scaled to ±1), rank among the correct (1 fastest), or the speedup."
    )
    speed_reward: Literal["threshold", "never", "always"] = Field(
        "threshold", description="When speed is rewarded: from the threshold on (CA-GRPO), never, or from the start."
    )
    log_clip: StrictFiniteFloat = Field(1.0, gt=0, description="log-speedup is clipped to ±this, then divided by it.")
    speedup_cap: StrictFiniteFloat | None = Field(
        None, gt=0, description="speed_score='speedup': S_i is capped at this (None: not capped)."
    )
    eps: StrictFiniteFloat = Field(1e-6, gt=0, description="Added to the group's reward deviation before dividing by it.")


class ScoreOptions(BaseModel):
    model_config = ConfigDict(frozen=True)

    backend: Literal["cuda", "triton"] = "triton"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    trials: StrictInt = Field(3, ge=1, le=20, description="Correctness trials, each with fresh secret inputs.")
    atol: StrictFiniteFloat | None = Field(None, gt=0, description="Default: KernelBench's (fp32 1e-4, fp16/bf16 1e-2).")
    rtol: StrictFiniteFloat | None = Field(None, gt=0)
    timeout_s: StrictFiniteFloat = Field(180.0, gt=0, le=3600, description="Wall-clock limit of each sandboxed child.")
    measure_speed: bool = True
    time_compiled: bool = Field(False, description="Also time the reference under torch.compile.")
    timing_budget_s: StrictFiniteFloat = Field(
        10.0, gt=0, le=600, description="GPU timing: how long each side's timed calls may take."
    )


class ScoreRequest(BaseModel):
    reference: str = Field(
        ..., min_length=1, max_length=MAX_SOURCE_CHARS, description="KernelBench reference: Model, get_inputs, get_init_inputs."
    )
    candidate: str = Field(..., min_length=1, max_length=MAX_SOURCE_CHARS, description="KernelBench candidate: ModelNew.")
    options: ScoreOptions = ScoreOptions()
    wait_s: StrictFiniteFloat = Field(
        60.0, ge=0, le=600, description="How long to wait for the verdict before answering with the job id."
    )


class GroupScoreRequest(BaseModel):
    reference: str = Field(..., min_length=1, max_length=MAX_SOURCE_CHARS)
    candidates: list[Annotated[str, Field(min_length=1, max_length=MAX_SOURCE_CHARS)]] = Field(..., min_length=1, max_length=64)
    options: ScoreOptions = ScoreOptions()
    ca_grpo: CAGRPOConfig = CAGRPOConfig()
    wait_s: StrictFiniteFloat = Field(60.0, ge=0, le=600)


@dataclass
class Verdict:
    """What the reward service concluded about one candidate, and the numbers behind it."""

    status: VerdictStatus
    reason: str
    guard: Guard | None = None
    max_abs_error: float | None = None
    runtime_ms: float | None = None
    ref_runtime_ms: float | None = None
    speedup: float | None = None
    details: dict[str, Any] = field(default_factory=dict)

    # pydantic's computed field over a property, which mypy does not follow
    @computed_field  # type: ignore[prop-decorator]
    @property
    def correct(self) -> bool:
        return self.status == "correct"

    def to_json(self) -> dict[str, Any]:
        """The verdict as JSON data, ``correct`` included."""
        data: dict[str, Any] = TypeAdapter(type(self)).dump_python(self, mode="json")
        return data


@dataclass
class ScoredVerdict(Verdict):
    """A verdict with its CA-GRPO reward and advantage within its group, and the device it ran on."""

    reward: float = 0.0
    advantage: float | None = None
    device: str | None = None


class GroupResult(BaseModel):
    verdicts: list[ScoredVerdict]
    correct_fraction: float
    speed_rewarded: bool


class ScoreResponse(BaseModel):
    job_id: str
    job_status: str
    verdict: ScoredVerdict | None = None
    error: str | None = None


class GroupScoreResponse(BaseModel):
    job_id: str
    job_status: str
    result: GroupResult | None = None
    error: str | None = None

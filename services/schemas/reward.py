"""Reward API schemas: what other RL pipelines, CI plugins and our own services send and get."""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, StrictInt, TypeAdapter, computed_field, model_validator
from pydantic.dataclasses import dataclass

from services.schemas.examples import RELU_REFERENCE, RELU_TRITON_KERNEL
from services.schemas.numbers import StrictFiniteFloat

MAX_SOURCE_CHARS = 200_000
MAX_GROUP_CANDIDATES = 64
ScoreDevice = Literal["auto", "cpu", "cuda"]
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

    backend: Literal["cuda", "triton"] = Field(
        "triton", description="The candidate's kernel language: triton or cuda (CUDA through torch's cpp_extension)."
    )
    device: ScoreDevice = Field(
        "auto", description="Where to run: cpu (Triton's interpreter, no timing), cuda, or auto (a GPU where the worker has one)."
    )
    trials: StrictInt = Field(3, ge=1, le=20, description="Correctness trials, each with fresh secret inputs.")
    atol: StrictFiniteFloat | None = Field(None, gt=0, description="Default: KernelBench's (fp32 1e-4, fp16/bf16 1e-2).")
    rtol: StrictFiniteFloat | None = Field(
        None, gt=0, description="Relative tolerance of the output comparison. Default: KernelBench's, the same as atol."
    )
    timeout_s: StrictFiniteFloat = Field(180.0, gt=0, le=3600, description="Wall-clock limit of each sandboxed child.")
    measure_speed: bool = Field(True, description="Time the candidate and the reference (GPU only) to give a speedup.")
    time_compiled: bool = Field(False, description="Also time the reference under torch.compile.")
    timing_budget_s: StrictFiniteFloat = Field(
        10.0, gt=0, le=600, description="GPU timing: how long each side's timed calls may take."
    )


class ScoreRequest(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"reference": RELU_REFERENCE, "candidate": RELU_TRITON_KERNEL, "options": {"backend": "triton"}, "wait_s": 60}
            ]
        }
    )

    reference: str = Field(
        ..., min_length=1, max_length=MAX_SOURCE_CHARS, description="KernelBench reference: Model, get_inputs, get_init_inputs."
    )
    candidate: str = Field(..., min_length=1, max_length=MAX_SOURCE_CHARS, description="KernelBench candidate: ModelNew.")
    options: ScoreOptions = Field(ScoreOptions(), description="How to compile, check and time the candidate.")
    wait_s: StrictFiniteFloat = Field(
        60.0, ge=0, le=600, description="How long to wait for the verdict before answering with the job id."
    )


class GroupScoreRequest(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "reference": RELU_REFERENCE,
                    "candidates": [RELU_TRITON_KERNEL, RELU_TRITON_KERNEL.replace("tl.maximum(x, 0.0)", "x")],
                    "options": {"backend": "triton"},
                    "wait_s": 60,
                }
            ]
        }
    )

    reference: str = Field(
        ..., min_length=1, max_length=MAX_SOURCE_CHARS, description="KernelBench reference: Model, get_inputs, get_init_inputs."
    )
    candidates: list[Annotated[str, Field(min_length=1, max_length=MAX_SOURCE_CHARS)]] = Field(
        ...,
        min_length=1,
        max_length=MAX_GROUP_CANDIDATES,
        description="1 to 64 KernelBench candidates (each defines ModelNew), all for the reference; one group for CA-GRPO.",
    )
    options: ScoreOptions = Field(ScoreOptions(), description="How to compile, check and time every candidate.")
    ca_grpo: CAGRPOConfig = Field(CAGRPOConfig(), description="How the group's verdicts become rewards (CA-GRPO).")
    wait_s: StrictFiniteFloat = Field(
        60.0, ge=0, le=600, description="How long to wait for the verdicts before answering 202 with the job id."
    )


@dataclass
class Verdict:
    """What the reward service concluded about one candidate, and the numbers behind it."""

    status: VerdictStatus = Field(
        description="correct, incorrect (wrong outputs), compile_error, runtime_error, timeout, rejected (a guard caught "
        "a hack: see guard) or unverified (could not be judged on this device)."
    )
    reason: str = Field(description="Why, in words: the first mismatch, the compiler's error, the guard's finding.")
    guard: Guard | None = Field(
        default=None, description="The guard that rejected the candidate (docs/REWARD.md); None otherwise."
    )
    max_abs_error: float | None = Field(default=None, description="Largest absolute difference from the reference's outputs.")
    runtime_ms: float | None = Field(
        default=None, description="The candidate's median runtime; None where speed was not measured."
    )
    ref_runtime_ms: float | None = Field(default=None, description="The reference's median runtime on the same inputs.")
    speedup: float | None = Field(default=None, description="ref_runtime_ms / runtime_ms; None where speed was not measured.")
    details: dict[str, Any] = Field(
        default_factory=dict, description="What the checks recorded (trials, launches, timings), for diagnosis."
    )

    # pydantic's computed field over a property, which mypy does not follow
    @computed_field(description="status == 'correct'.")  # type: ignore[prop-decorator]
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

    reward: float = Field(default=0.0, description="The candidate's CA-GRPO reward within its group.")
    advantage: float | None = Field(
        default=None, description="The reward's group-normalized advantage; None for a lone candidate."
    )
    device: str | None = Field(default=None, description="The device it ran on, e.g. cpu or cuda:0.")


class GroupResult(BaseModel):
    verdicts: list[ScoredVerdict] = Field(description="One verdict per candidate, in the order sent.")
    correct_fraction: float = Field(description="Share of the group's candidates judged correct.")
    speed_rewarded: bool = Field(description="Whether speed entered the rewards (the correct fraction reached the threshold).")


class ScoreResponse(BaseModel):
    job_id: str = Field(description="The scoring job; GET /v1/jobs/{job_id} reads it while it runs.")
    job_status: str = Field(description="queued, running, succeeded or failed; verdict is set once succeeded.")
    verdict: ScoredVerdict | None = Field(
        None, description="The candidate's verdict with its reward; None until the job succeeded."
    )
    error: str | None = Field(
        None, description="Why the job failed (not a verdict on the candidate: the service could not judge it)."
    )


class GroupScoreResponse(BaseModel):
    job_id: str = Field(description="The scoring job, also the group's id in the stored scores; GET /v1/jobs/{job_id} reads it.")
    job_status: str = Field(description="queued, running, succeeded or failed; result is set once succeeded.")
    result: GroupResult | None = Field(None, description="The group's verdicts and rewards; None until the job succeeded.")
    error: str | None = Field(
        None, description="Why the job failed (not a verdict on the candidates: the service could not judge them)."
    )


class RemoteRewardRequest(BaseModel):
    """OpenRLHF's remote reward protocol (``--remote_rm_url``): its rollout workers post the decoded
    prompt and response as ``query``, the dataset's prompt and its label (here: the reference module)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "query": [f"Write ModelNew for this module.\n```python\n{RELU_TRITON_KERNEL}```"],
                    "prompts": ["Write ModelNew for this module."],
                    "labels": [RELU_REFERENCE],
                }
            ]
        }
    )

    query: list[Annotated[str, Field(max_length=2 * MAX_SOURCE_CHARS)]] = Field(
        ...,
        min_length=1,
        max_length=MAX_GROUP_CANDIDATES,
        description="Each sample's prompt and response as one text; the kernel is extracted from what follows the prompt.",
    )
    prompts: list[Annotated[str, Field(max_length=2 * MAX_SOURCE_CHARS)]] | None = Field(
        None, description="Each sample's prompt (cut from its query); samples of one prompt and label are one group."
    )
    labels: list[Annotated[str, Field(min_length=1, max_length=MAX_SOURCE_CHARS)]] = Field(
        ..., description="Each sample's reference module (KernelBench: Model, get_inputs, get_init_inputs)."
    )

    @model_validator(mode="after")
    def _one_of_each_per_sample(self) -> RemoteRewardRequest:
        sizes = {"query": len(self.query), "labels": len(self.labels)} | ({"prompts": len(self.prompts)} if self.prompts else {})
        if len(set(sizes.values())) != 1:
            raise ValueError(f"query, prompts and labels must have one entry per sample; got {sizes}")
        return self


class RemoteRewardResponse(BaseModel):
    """What OpenRLHF reads back: one reward and one score per sample, and figures for its logs."""

    rewards: list[float] = Field(description="Each sample's CA-GRPO reward (0.0 for a reply without a kernel or not judged).")
    scores: list[float] = Field(description="1.0 for a verified kernel, else 0.0 (OpenRLHF's dynamic filtering reads it).")
    extra_logs: dict[str, list[float]] = Field(
        description="Per sample: correct (1/0), scored (0: the service could not judge it) and speedup (0 where not measured)."
    )

"""Scoring RL samples in groups: the samples of one prompt (same reference module and backend) go to the
reward service as one ``/v1/score/group`` call, since CA-GRPO's threshold is a property of a group.

The rules every RL adapter shares:

- the kernel is pulled from the raw completion with the Coder's extractor (``services.llm.extract``);
  a completion with no program defining ``ModelNew`` earns 0.0, what an incorrect kernel earns: it was
  judged, and it failed;
- a sample the service could not judge (no answer, the job failed or ran out of time, an ``unverified``
  verdict: no device to check it on) gets ``None`` rather than a made-up number, so the trainer leaves
  it out.

``regroup`` and ``group_scores`` are pure; ``score_samples`` (asyncio) and ``score_samples_blocking`` only
send the groups.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from services.clients import AsyncRewardClient, JobTimeout, RetryPolicy, RewardClient, ServiceError, ServiceUnreachable
from services.llm.extract import extract_code
from services.schemas.coder import KernelBackendName
from services.schemas.reward import MAX_GROUP_CANDIDATES, CAGRPOConfig, GroupScoreResponse, ScoredVerdict, ScoreOptions

NO_PROGRAM = "the completion holds no Python program defining ModelNew"


@dataclass(frozen=True)
class Sample:
    """One completion to score: ``prompt_key`` is the same for every completion of one prompt."""

    prompt_key: Hashable
    reference: str
    completion: str
    backend: KernelBackendName = "triton"


@dataclass(frozen=True)
class SampleScore:
    """A sample's reward (None: not scored, the reason says why) and the service's verdict, where it gave one."""

    reward: float | None
    reason: str
    verdict: ScoredVerdict | None = None

    @property
    def correct(self) -> bool:
        return self.verdict is not None and self.verdict.correct


@dataclass
class Group:
    """The samples of one prompt: their indices in the batch, and the kernels extracted from them."""

    reference: str
    backend: KernelBackendName
    indices: list[int] = field(default_factory=list)
    kernels: list[str | None] = field(default_factory=list)

    @property
    def candidates(self) -> list[str]:
        return [k for k in self.kernels if k is not None]


@dataclass(frozen=True)
class ScoringSettings:
    """How the adapters score: where the reward service is, and what they ask it for."""

    url: str | None = None  # None: the settings' reward URL (KZ_HOST, KZ_REWARD_PORT)
    api_key: str | None = None  # None: KZ_API_KEY, else the key `kernelzero up` left in the data dir
    options: ScoreOptions = field(default_factory=ScoreOptions)
    ca_grpo: CAGRPOConfig = field(default_factory=CAGRPOConfig)
    wait_s: float = 900.0  # per group, from submitting it to its verdicts
    retry: RetryPolicy = field(default_factory=RetryPolicy)  # on no connection, 429 and 5xx


def regroup(samples: Sequence[Sample]) -> list[Group]:
    """The samples by prompt (and reference and backend), in order of first appearance, kernels extracted."""
    groups: dict[tuple[Hashable, str, str], Group] = {}
    for index, sample in enumerate(samples):
        key = (sample.prompt_key, sample.reference, sample.backend)
        group = groups.setdefault(key, Group(sample.reference, sample.backend))
        group.indices.append(index)
        group.kernels.append(extract_code(sample.completion))
    too_big = [len(g.candidates) for g in groups.values() if len(g.candidates) > MAX_GROUP_CANDIDATES]
    if too_big:
        raise ValueError(f"a group of {max(too_big)} kernels: the reward service scores at most {MAX_GROUP_CANDIDATES} per group")
    return list(groups.values())


def group_scores(group: Group, answer: GroupScoreResponse | Exception | None) -> list[SampleScore]:
    """Each of the group's samples' score, from the service's answer (None: nothing was sent, no kernels)."""
    verdicts: list[ScoredVerdict] | None = None
    failure = ""
    if isinstance(answer, Exception):
        failure = f"not scored: {type(answer).__name__}: {answer}"
    elif answer is not None and answer.result is None:
        failure = f"not scored: job {answer.job_id} {answer.job_status}" + (f": {answer.error}" if answer.error else "")
    elif answer is not None and answer.result is not None:
        verdicts = list(answer.result.verdicts)
    scores = []
    for kernel in group.kernels:
        if kernel is None:
            scores.append(SampleScore(0.0, NO_PROGRAM))
        elif verdicts is None:
            scores.append(SampleScore(None, failure))
        else:
            verdict = verdicts.pop(0)
            reward = None if verdict.status == "unverified" else verdict.reward
            scores.append(SampleScore(reward, verdict.reason, verdict))
    return scores


def in_batch_order(
    samples: Sequence[Sample], groups: list[Group], answers: Sequence[GroupScoreResponse | Exception | None]
) -> list[SampleScore]:
    ordered: list[SampleScore | None] = [None] * len(samples)
    for group, answer in zip(groups, answers, strict=True):
        for index, score in zip(group.indices, group_scores(group, answer), strict=True):
            ordered[index] = score
    return [score for score in ordered if score is not None]


async def score_samples(samples: Sequence[Sample], settings: ScoringSettings) -> list[SampleScore]:
    """Every sample's score, in order; the groups are scored concurrently, one call each."""
    groups = regroup(samples)

    async def score(client: AsyncRewardClient, group: Group) -> GroupScoreResponse | Exception | None:
        if not group.candidates:
            return None
        try:
            return await client.score_group(
                group.reference, group.candidates, options_for(settings, group), settings.ca_grpo, settings.wait_s
            )
        except (ServiceError, ServiceUnreachable, JobTimeout) as exc:
            return exc

    async with AsyncRewardClient(settings.url, settings.api_key, timeout_s=60.0, retry=settings.retry) as client:
        answers = await asyncio.gather(*(score(client, group) for group in groups))
    return in_batch_order(samples, groups, answers)


def score_samples_blocking(samples: Sequence[Sample], settings: ScoringSettings) -> list[SampleScore]:
    """``score_samples`` for callers without an event loop (verl's reward managers): groups one after another."""
    groups = regroup(samples)
    answers: list[GroupScoreResponse | Exception | None] = []
    with RewardClient(settings.url, settings.api_key, timeout_s=60.0, retry=settings.retry) as client:
        for group in groups:
            if not group.candidates:
                answers.append(None)
                continue
            try:
                answers.append(
                    client.score_group(
                        group.reference, group.candidates, options_for(settings, group), settings.ca_grpo, settings.wait_s
                    )
                )
            except (ServiceError, ServiceUnreachable, JobTimeout) as exc:
                answers.append(exc)
    return in_batch_order(samples, groups, answers)


def options_for(settings: ScoringSettings, group: Group) -> ScoreOptions:
    return settings.options.model_copy(update={"backend": group.backend})

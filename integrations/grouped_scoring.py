"""Scoring RL samples over HTTP, one ``/v1/score/group`` call per prompt's group (the rules are
``services.rl_samples``): ``score_samples`` on asyncio (TRL), ``score_samples_blocking`` for callers
without an event loop (verl's reward managers)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from services.clients import AsyncRewardClient, JobTimeout, RetryPolicy, RewardClient, ServiceError, ServiceUnreachable
from services.rl_samples import Group, Sample, SampleScore, in_batch_order, regroup
from services.schemas.reward import CAGRPOConfig, GroupScoreResponse, ScoreOptions

__all__ = ["Sample", "SampleScore", "ScoringSettings", "score_samples", "score_samples_blocking"]


@dataclass(frozen=True)
class ScoringSettings:
    """How the adapters score: where the reward service is, and what they ask it for."""

    url: str | None = None  # None: the settings' reward URL (KZ_HOST, KZ_REWARD_PORT)
    api_key: str | None = None  # None: KZ_API_KEY, else the key `kernelzero up` left in the data dir
    options: ScoreOptions = field(default_factory=ScoreOptions)
    ca_grpo: CAGRPOConfig = field(default_factory=CAGRPOConfig)
    wait_s: float = 900.0  # per group, from submitting it to its verdicts
    retry: RetryPolicy = field(default_factory=RetryPolicy)  # on no connection, 429 and 5xx


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

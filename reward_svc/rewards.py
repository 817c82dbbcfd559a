"""CA-GRPO: correctness-aware group rewards and advantages (DESIGN.md §1).

While fewer than ``threshold`` of a group is correct, the reward is correctness alone; once the
group reaches it, correct candidates also earn a speed score among the group's correct ones.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field


class CAGRPOConfig(BaseModel):
    threshold: float = Field(0.5, ge=0, le=1, description="Group correct fraction from which speed counts.")
    speed_weight: float = Field(0.5, ge=0, description="λ: weight of the speed score.")
    speed_score: Literal["log_speedup", "rank"] = "log_speedup"
    log_clip: float = Field(1.0, gt=0, description="log-speedup is clipped to ±this, then divided by it.")
    eps: float = Field(1e-6, gt=0)


@dataclass(frozen=True)
class GroupRewards:
    rewards: list[float]
    advantages: list[float]
    correct_fraction: float
    speed_rewarded: bool


def speed_scores(correct: list[bool], speedups: list[float | None], config: CAGRPOConfig) -> list[float]:
    """Speed score of each candidate among the group's correct ones (0 for incorrect or unmeasured)."""
    measured = [i for i, (c, s) in enumerate(zip(correct, speedups)) if c and s is not None and s > 0]
    scores = [0.0] * len(correct)
    if config.speed_score == "log_speedup":
        for i in measured:
            clipped = max(-config.log_clip, min(config.log_clip, math.log(speedups[i])))  # type: ignore[arg-type]
            scores[i] = clipped / config.log_clip
    else:  # rank: fastest correct 1, slowest 0, evenly spaced between
        ordered = sorted(measured, key=lambda i: speedups[i], reverse=True)  # type: ignore[arg-type,return-value]
        for rank, i in enumerate(ordered):
            scores[i] = 1.0 if len(ordered) == 1 else 1.0 - rank / (len(ordered) - 1)
    return scores


def group_rewards(correct: list[bool], speedups: list[float | None], config: CAGRPOConfig | None = None) -> GroupRewards:
    config = config or CAGRPOConfig()
    if not correct:
        return GroupRewards([], [], 0.0, False)
    rho = sum(correct) / len(correct)
    speed_on = rho >= config.threshold
    scores = speed_scores(correct, speedups, config) if speed_on else [0.0] * len(correct)
    rewards = [float(c) + config.speed_weight * s for c, s in zip(correct, scores)]
    mean = statistics.fmean(rewards)
    std = statistics.pstdev(rewards)
    advantages = [(r - mean) / (std + config.eps) for r in rewards]
    return GroupRewards(rewards, advantages, rho, speed_on)

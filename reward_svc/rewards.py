"""CA-GRPO: correctness-aware group rewards and advantages (docs/REWARD.md, "Rewards").

While fewer than ``threshold`` of a group is correct, the reward is correctness alone; once the
group reaches it, correct candidates also earn a speed score among the group's correct ones.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from services.schemas.reward import CAGRPOConfig


@dataclass(frozen=True)
class GroupRewards:
    rewards: list[float]
    advantages: list[float]
    correct_fraction: float
    speed_rewarded: bool


def speed_scores(correct: list[bool], speedups: list[float | None], config: CAGRPOConfig) -> list[float]:
    """Speed score of each candidate among the group's correct ones (0 for incorrect or unmeasured)."""
    measured = {i: s for i, (c, s) in enumerate(zip(correct, speedups)) if c and s is not None and s > 0}
    scores = [0.0] * len(correct)
    if config.speed_score == "log_speedup":
        for i, speedup in measured.items():
            clipped = max(-config.log_clip, min(config.log_clip, math.log(speedup)))
            scores[i] = clipped / config.log_clip
    elif config.speed_score == "speedup":  # the source's S_i
        for i, speedup in measured.items():
            scores[i] = speedup if config.speedup_cap is None else min(speedup, config.speedup_cap)
    else:  # rank: fastest correct 1, slowest 0, evenly spaced between
        ordered = sorted(measured, key=measured.__getitem__, reverse=True)
        for rank, i in enumerate(ordered):
            scores[i] = 1.0 if len(ordered) == 1 else 1.0 - rank / (len(ordered) - 1)
    return scores


def group_rewards(correct: list[bool], speedups: list[float | None], config: CAGRPOConfig | None = None) -> GroupRewards:
    config = config or CAGRPOConfig()
    if not correct:
        return GroupRewards([], [], 0.0, False)
    rho = sum(correct) / len(correct)
    speed_on = {"threshold": rho >= config.threshold, "never": False, "always": True}[config.speed_reward]
    scores = speed_scores(correct, speedups, config) if speed_on else [0.0] * len(correct)
    rewards = [float(c) + config.speed_weight * s for c, s in zip(correct, scores)]
    return GroupRewards(rewards, group_advantages(rewards, config.eps), rho, speed_on)


def group_advantages(rewards: list[float], eps: float = 1e-6) -> list[float]:
    """GRPO's advantages within one group: ``(r - mean) / (std + eps)`` (the population deviation).
    The one place they are computed: the reward service reports them, the trainer trains on them."""
    if not rewards:
        return []
    mean, std = statistics.fmean(rewards), statistics.pstdev(rewards)
    return [(r - mean) / (std + eps) for r in rewards]

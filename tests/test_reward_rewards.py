"""CA-GRPO on hand-computed groups (docs/REWARD.md, "Rewards")."""

from __future__ import annotations

import math

import pytest

from reward_svc.rewards import group_rewards
from services.schemas.reward import CAGRPOConfig


def test_below_threshold_rewards_correctness_only() -> None:
    # 1 of 3 correct (ρ = 1/3 < 0.5): speed is ignored even though it was measured.
    result = group_rewards([True, False, False], [4.0, None, None])
    assert result.rewards == [1.0, 0.0, 0.0]
    assert not result.speed_rewarded
    std = math.sqrt(((2 / 3) ** 2 + 2 * (1 / 3) ** 2) / 3)
    assert result.advantages == pytest.approx([(2 / 3) / std, -(1 / 3) / std, -(1 / 3) / std], rel=1e-5)


def test_at_threshold_fast_correct_kernels_earn_more() -> None:
    # 2 of 4 correct (ρ = 0.5): log-speedup clipped to ±1, λ = 0.5.
    result = group_rewards([True, True, False, False], [math.e**0.5, 0.5, None, None])
    assert result.speed_rewarded
    assert result.rewards == pytest.approx([1 + 0.5 * 0.5, 1 + 0.5 * math.log(0.5), 0.0, 0.0])
    mean = sum(result.rewards) / 4
    std = math.sqrt(sum((r - mean) ** 2 for r in result.rewards) / 4)
    assert result.advantages == pytest.approx([(r - mean) / (std + 1e-6) for r in result.rewards])


def test_speedup_is_clipped() -> None:
    result = group_rewards([True], [100.0], CAGRPOConfig(speed_weight=1.0, log_clip=1.0))
    assert result.rewards == [2.0]
    assert result.advantages == [0.0]


def test_rank_speed_score() -> None:
    result = group_rewards([True, True, True, False], [1.0, 3.0, 2.0, None], CAGRPOConfig(speed_score="rank", speed_weight=1.0))
    assert result.rewards == [1.0, 2.0, 1.5, 0.0]


def test_unmeasured_speed_gives_no_speed_score() -> None:
    result = group_rewards([True, True], [None, None])
    assert result.rewards == [1.0, 1.0]
    assert result.advantages == [0.0, 0.0]


def test_threshold_is_configurable() -> None:
    never = group_rewards([True, True, False], [2.0, 1.0, None], CAGRPOConfig(threshold=1.0))
    assert never.rewards == [1.0, 1.0, 0.0]
    always = group_rewards([True, False, False, False], [2.0, None, None, None], CAGRPOConfig(threshold=0.0, speed_weight=1.0))
    assert always.rewards == pytest.approx([1 + math.log(2.0), 0, 0, 0])


def test_the_sources_reward_and_its_ablations() -> None:
    """``r_i = 1 + T·β·S_i`` with S_i the speedup (capped where asked), T from the threshold on; the
    source's ablations: speed never rewarded, or rewarded from the start."""
    paper = CAGRPOConfig(speed_score="speedup", speed_weight=0.1, speedup_cap=3.0)
    group = ([True, True, False, False], [2.0, 5.0, None, None])  # half correct: at the threshold
    assert group_rewards(*group, paper).rewards == pytest.approx([1.2, 1.3, 0.0, 0.0])  # 5x capped at 3
    below = ([True, False, False, False], [2.0, None, None, None])
    assert group_rewards(*below, paper).rewards == [1.0, 0.0, 0.0, 0.0]
    always = paper.model_copy(update={"speed_reward": "always"})
    assert group_rewards(*below, always).rewards == pytest.approx([1.2, 0.0, 0.0, 0.0])
    never = paper.model_copy(update={"speed_reward": "never"})
    assert group_rewards(*group, never).rewards == [1.0, 1.0, 0.0, 0.0] and not group_rewards(*group, never).speed_rewarded
    uncapped = paper.model_copy(update={"speedup_cap": None})
    assert group_rewards(*group, uncapped).rewards == pytest.approx([1.2, 1.5, 0.0, 0.0])


def test_ties_in_speed_and_all_alike_groups_give_no_advantage() -> None:
    tie = group_rewards([True, True], [2.0, 2.0], CAGRPOConfig(speed_score="speedup", speed_weight=0.1))
    assert tie.rewards == pytest.approx([1.2, 1.2]) and tie.advantages == [0.0, 0.0]
    assert group_rewards([False, False, False], [None, None, None]).advantages == [0.0, 0.0, 0.0]
    assert group_rewards([True] * 3, [None] * 3).advantages == [0.0, 0.0, 0.0]

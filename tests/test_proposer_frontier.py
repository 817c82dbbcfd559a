"""The frontier reward, round selection and per-API failure rates; pass rates from real DB rows."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from proposer_svc.frontier import (
    FrontierConfig,
    TaskPassRate,
    api_failure_rates,
    frontier_reward,
    pass_rate_histogram,
    select_frontier,
    task_pass_rates,
)
from services.config import Settings
from services.db import migrate
from services.db.models import Candidate, Score, Task
from services.db.session import session_scope

GAUSSIAN = FrontierConfig(shape="gaussian", width=0.2)


def test_linear_frontier_reward() -> None:
    assert frontier_reward(0.5) == 1.0
    assert frontier_reward(0.0) == 0.0 and frontier_reward(1.0) == 0.0
    assert frontier_reward(0.25) == pytest.approx(0.5)
    assert frontier_reward(0.9) == pytest.approx(0.2)
    with pytest.raises(ValueError):
        frontier_reward(1.5)


def test_gaussian_frontier_reward() -> None:
    assert frontier_reward(0.5, GAUSSIAN) == 1.0
    assert frontier_reward(0.7, GAUSSIAN) == pytest.approx(math.exp(-0.5))
    assert frontier_reward(0.3, GAUSSIAN) == pytest.approx(frontier_reward(0.7, GAUSSIAN))
    narrow = FrontierConfig(shape="gaussian", width=0.05)
    assert frontier_reward(0.6, narrow) == pytest.approx(math.exp(-2.0))
    assert frontier_reward(0.6, narrow) < frontier_reward(0.6, GAUSSIAN)
    assert frontier_reward(0.0, GAUSSIAN) == pytest.approx(math.exp(-3.125))  # never exactly 0, unlike linear


def test_settings_pick_the_shape(kz_env: Callable[..., Settings]) -> None:
    config = FrontierConfig.from_settings(
        kz_env(proposer_frontier_shape="gaussian", proposer_frontier_width=0.1, proposer_min_attempts=8)
    )
    assert (config.shape, config.width, config.min_attempts) == ("gaussian", 0.1, 8)
    assert frontier_reward(0.6, config) == pytest.approx(math.exp(-0.5))


RATES = [
    TaskPassRate("half", scored=8, correct=4, api_set=("torch.matmul", "torch.relu")),
    TaskPassRate("easy", scored=8, correct=8, api_set=("torch.relu",)),
    TaskPassRate("hard", scored=8, correct=0, api_set=("torch.matmul", "torch.nn.Conv2d")),
    TaskPassRate("quarter", scored=8, correct=2, api_set=("torch.nn.Conv2d",)),
    TaskPassRate("mostly", scored=10, correct=7, api_set=()),
    TaskPassRate("new", scored=0, correct=0, api_set=("torch.tanh",)),
    TaskPassRate("tried-once", scored=1, correct=1, api_set=("torch.tanh",)),
]


def test_selection_prefers_the_frontier_and_explores_a_share() -> None:
    config = FrontierConfig(min_attempts=4, explore_fraction=0.25)
    chosen = select_frontier(RATES, 4, config)
    assert [t.task_id for t in chosen] == ["half", "mostly", "quarter", "new"]
    assert [t.explored for t in chosen] == [False, False, False, True]
    assert chosen[0].reward == 1.0 and chosen[1].reward == pytest.approx(0.6) and chosen[2].reward == pytest.approx(0.5)
    assert chosen[3].reward is None and chosen[3].pass_rate is None and chosen[3].attempts == 0


def test_selection_never_picks_solved_or_hopeless_tasks_and_fills_slots() -> None:
    chosen = select_frontier(RATES, 10, FrontierConfig(min_attempts=4, explore_fraction=0.0))
    ids = [t.task_id for t in chosen]
    assert "easy" not in ids and "hard" not in ids
    assert ids == ["half", "mostly", "quarter", "new", "tried-once"]  # spare slots go to exploration
    assert select_frontier(RATES, 0) == []


def test_gaussian_selection_ranks_by_distance_from_half() -> None:
    rates = [TaskPassRate("a", 10, 9), TaskPassRate("b", 10, 4), TaskPassRate("c", 10, 2)]
    assert [t.task_id for t in select_frontier(rates, 3, FrontierConfig(shape="gaussian", explore_fraction=0))] == ["b", "c", "a"]


def test_histogram_and_failure_rates() -> None:
    edges, counts = pass_rate_histogram(RATES, bins=4, min_attempts=4)
    assert edges == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert counts == [1, 1, 2, 1]  # 0.0 | 0.25 | 0.5, 0.7 | 1.0 (the last bin holds p = 1)
    failures = api_failure_rates(RATES)
    assert failures["torch.matmul"] == pytest.approx((4 + 8) / 16)
    assert failures["torch.relu"] == pytest.approx(4 / 16)
    assert failures["torch.nn.Conv2d"] == pytest.approx((8 + 6) / 16)
    assert failures["torch.tanh"] == 0.0
    assert set(failures) == {"torch.matmul", "torch.relu", "torch.nn.Conv2d", "torch.tanh"}


def test_pass_rates_from_persisted_verdicts(kz_env: Callable[..., Settings]) -> None:
    kz_env()
    migrate.upgrade()
    with session_scope() as session:
        tasks = {
            name: Task(source=f"# {name}", source_hash=name * 8, origin="composer", status=status, api_set=apis)
            for name, status, apis in [
                ("aa", "valid", ["torch.relu"]),
                ("bb", "valid", ["torch.matmul"]),
                ("cc", "rejected", ["torch.tanh"]),
                ("dd", "reference", None),
            ]
        }
        session.add_all(tasks.values())
        session.flush()
        # aa: two candidates, 3 verdicts of 4 correct (one candidate scored twice); cc: rejected, not in the pool.
        for task, verdicts in [("aa", [[True, True], [True, False]]), ("cc", [[True]]), ("dd", [[False, False]])]:
            for candidate_verdicts in verdicts:
                candidate = Candidate(task_id=tasks[task].id, backend="triton", source="x", source_hash="x")
                session.add(candidate)
                session.flush()
                session.add_all(
                    Score(candidate_id=candidate.id, status="correct" if ok else "incorrect", correct=ok, reason="r")
                    for ok in candidate_verdicts
                )
        ids = {name: task.id for name, task in tasks.items()}
    rates = {r.task_id: r for r in task_pass_rates()}
    assert set(rates) == {ids["aa"], ids["bb"], ids["dd"]}
    assert (rates[ids["aa"]].scored, rates[ids["aa"]].correct, rates[ids["aa"]].pass_rate) == (4, 3, 0.75)
    assert (rates[ids["bb"]].scored, rates[ids["bb"]].pass_rate) == (0, None)
    assert (rates[ids["dd"]].scored, rates[ids["dd"]].correct) == (2, 0)
    assert rates[ids["aa"]].api_set == ("torch.relu",)
    chosen = select_frontier(list(rates.values()), 2, FrontierConfig(min_attempts=4, explore_fraction=0.5))
    assert [(t.task_id, t.explored) for t in chosen] == [(ids["aa"], False), (ids["bb"], True)]
    assert chosen[0].reward == pytest.approx(0.5)

"""The frontier: per-task Coder pass rates from the reward service's verdicts, the Proposer's
frontier reward, and which tasks the next round should train on.

A task's pass rate is ``correct / scored`` over every persisted verdict (scores -> candidates ->
tasks). The reward (docs/PROPOSER.md) peaks where the Coder solves a task about half the time:
``linear`` is ``1 - |2p - 1|``, ``gaussian`` is ``exp(-(p - 0.5)^2 / (2 width^2))``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Literal

import numpy as np
from sqlalchemy import case, func, select

from services.config import Settings, get_settings
from services.db.models import Candidate, Score, Task
from services.db.session import session_scope

FrontierShape = Literal["linear", "gaussian"]


@dataclass(frozen=True)
class FrontierConfig:
    shape: FrontierShape = "linear"
    width: float = 0.2  # gaussian standard deviation
    min_attempts: int = 4
    explore_fraction: float = 0.25

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> FrontierConfig:
        s = settings or get_settings()
        return cls(s.proposer_frontier_shape, s.proposer_frontier_width, s.proposer_min_attempts, s.proposer_explore_fraction)


@dataclass(frozen=True)
class TaskPassRate:
    task_id: str
    scored: int
    correct: int
    api_set: tuple[str, ...] = ()

    @property
    def pass_rate(self) -> float | None:
        return self.correct / self.scored if self.scored else None


@dataclass(frozen=True)
class FrontierTask:
    task_id: str
    pass_rate: float | None  # None: never scored
    attempts: int
    reward: float | None  # None: too few attempts to judge
    explored: bool  # chosen to measure it, not because it sits on the frontier


def frontier_reward(pass_rate: float, config: FrontierConfig = FrontierConfig()) -> float:
    """1 at p = 0.5, 0 (linear) or near 0 (gaussian) at p = 0 and p = 1."""
    if not 0.0 <= pass_rate <= 1.0:
        raise ValueError(f"pass rate {pass_rate} is outside [0, 1]")
    if config.shape == "linear":
        return 1.0 - abs(2.0 * pass_rate - 1.0)
    return math.exp(-((pass_rate - 0.5) ** 2) / (2.0 * config.width**2))


POOL_STATUSES = ("valid", "reference")  # proposed tasks that passed validation, and tasks scored as given


def task_pass_rates(statuses: tuple[str, ...] = POOL_STATUSES) -> list[TaskPassRate]:
    """Every task with one of these statuses, with its verdict counts (0 scored when never tried)."""
    counts = (
        select(
            Candidate.task_id, func.count(Score.id).label("scored"), func.sum(case((Score.correct, 1), else_=0)).label("correct")
        )
        .join(Score, Score.candidate_id == Candidate.id)
        .where(Score.status != "unverified")  # not checked (CUDA without a GPU): neither a pass nor a failure
        .group_by(Candidate.task_id)
        .subquery()
    )
    query = (
        select(Task.id, Task.api_set, counts.c.scored, counts.c.correct)
        .outerjoin(counts, counts.c.task_id == Task.id)
        .where(Task.status.in_(statuses))
        .order_by(Task.created_at.desc())
    )
    with session_scope() as session:
        rows = session.execute(query).all()
    return [
        TaskPassRate(task_id, int(scored or 0), int(correct or 0), tuple(api_set or ()))
        for task_id, api_set, scored, correct in rows
    ]


def pass_rate_histogram(rates: list[TaskPassRate], bins: int = 10, min_attempts: int = 1) -> tuple[list[float], list[int]]:
    """Bin edges and task counts over tasks with at least ``min_attempts`` verdicts (p = 1 in the last bin)."""
    values = [r.pass_rate for r in rates if r.scored >= min_attempts]
    counts, edges = np.histogram(np.asarray(values, dtype=float), bins=bins, range=(0.0, 1.0))
    return [round(float(e), 9) for e in edges], [int(c) for c in counts]


def select_frontier(rates: list[TaskPassRate], count: int, config: FrontierConfig = FrontierConfig()) -> list[FrontierTask]:
    """The next round's tasks: the highest frontier reward among tasks with enough attempts, plus
    a share of under-attempted ones (fewest attempts first) so new tasks get measured. Tasks the
    Coder always or never solves carry no signal and are left out; any slots the frontier cannot
    fill go to exploration, and the other way round."""
    measured = sorted(
        (r for r in rates if r.scored >= config.min_attempts and 0 < r.correct < r.scored),
        key=lambda r: (-frontier_reward(r.pass_rate or 0.0, config), -r.scored),  # measured: its pass rate is known
    )
    unmeasured = sorted((r for r in rates if r.scored < config.min_attempts), key=lambda r: r.scored)  # stable: newest first
    explore = min(len(unmeasured), round(count * config.explore_fraction))
    exploit = min(len(measured), count - explore)
    explore = min(len(unmeasured), count - exploit)
    chosen = [_frontier_task(r, config, explored=False) for r in measured[:exploit]]
    return chosen + [_frontier_task(r, config, explored=True) for r in unmeasured[:explore]]


def _frontier_task(rate: TaskPassRate, config: FrontierConfig, explored: bool) -> FrontierTask:
    judged = rate.scored >= config.min_attempts
    reward = frontier_reward(rate.pass_rate, config) if judged and rate.pass_rate is not None else None
    return FrontierTask(rate.task_id, rate.pass_rate, rate.scored, reward, explored)


def api_failure_rates(rates: list[TaskPassRate]) -> dict[str, float]:
    """Per API: the share of failed verdicts over the tasks whose API set holds it (the sampler's bias)."""
    scored: dict[str, int] = defaultdict(int)
    failed: dict[str, int] = defaultdict(int)
    for rate in rates:
        for api in set(rate.api_set):
            scored[api] += rate.scored
            failed[api] += rate.scored - rate.correct
    return {api: failed[api] / n for api, n in scored.items() if n}

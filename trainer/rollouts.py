"""Rollout intake and claiming: the samples the Coder (or the Proposer) drew for training, scored by the
reward service, stored a group at a time, and taken by a training run a whole group at a time, once.

- ``record_group`` stores one prompt's samples with their verdicts and rewards (idempotent per group
  id, so a job delivered twice stores it once).
- ``claim_groups`` takes the oldest unclaimed groups for a run: each group is claimed by one atomic
  update of its row (two runs racing never share one, nor train on a rollout twice), then kept or
  dropped with the reason: ``stale`` (its model version lags the current one by more than K),
  ``unscored`` (the reward service failed on one of its samples: infrastructure, not a verdict, so it
  is left out of the loss rather than scored 0), ``no_signal`` (every reward equal: zero advantage,
  DAPO's filter), ``size`` (not the run's group size). Advantages are computed here, from the rewards,
  by the one function the reward service uses too (``reward_svc.group_advantages``).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy import select, update

from reward_svc import group_advantages
from services.db.models import ModelVersion, Rollout, RolloutGroup
from services.db.session import session_scope

UNSCORED = "unscored"


@dataclass(frozen=True)
class Sample:
    """One sample to store: the exact prompt text the model saw, what it wrote, how it was judged."""

    prompt: str
    completion: str
    status: str  # the verdict's status, or UNSCORED
    reward: float | None
    completion_ids: list[int] | None = None
    behaviour_logps: list[float] | None = None  # the sampler's per-token log-probs, where the backend gave them
    candidate_id: str | None = None


@dataclass(frozen=True)
class ClaimedSample:
    prompt: str
    completion: str
    completion_ids: list[int] | None
    behaviour_logps: list[float] | None
    reward: float
    advantage: float


@dataclass(frozen=True)
class ClaimedGroup:
    id: str
    model_version_id: str | None
    samples: list[ClaimedSample]


@dataclass
class Claim:
    groups: list[ClaimedGroup] = field(default_factory=list)
    dropped: Counter[str] = field(default_factory=Counter)


def record_group(
    role: str,
    samples: list[Sample],
    *,
    group_id: str | None = None,
    task_id: str | None = None,
    job_id: str | None = None,
    model_version_id: str | None = None,
) -> str:
    """Store one group; with a ``group_id`` that exists already, nothing (the same job, delivered again)."""
    scored = [s.reward for s in samples if s.status != UNSCORED and s.reward is not None]
    advantages = iter(group_advantages(scored)) if len(scored) == len(samples) else None
    with session_scope() as session:
        if group_id is not None and session.get(RolloutGroup, group_id) is not None:
            return group_id
        group = RolloutGroup(role=role, task_id=task_id, job_id=job_id, model_version_id=model_version_id, size=len(samples))
        if group_id is not None:
            group.id = group_id
        session.add(group)
        session.flush()
        for sample in samples:
            session.add(
                Rollout(
                    group_id=group.id,
                    candidate_id=sample.candidate_id,
                    task_id=task_id,
                    prompt=sample.prompt,
                    completion=sample.completion,
                    completion_ids=sample.completion_ids,
                    behaviour_logps=sample.behaviour_logps,
                    status=sample.status,
                    reward=sample.reward,
                    advantage=next(advantages) if advantages is not None else None,
                    model_version_id=model_version_id,
                )
            )
        return group.id


def version_lag(order: list[str], current: str | None, group_version: str | None) -> int:
    """How many model versions (``order``: a role's, oldest first) came after the one a group was
    sampled under (0: the current one, or no versions recorded)."""
    if current is None or group_version == current or current not in order:
        return 0
    if group_version not in order:  # sampled before any recorded version: as old as the first
        return order.index(current) + 1
    return order.index(current) - order.index(group_version)


def claim_groups(
    run_id: str,
    role: str,
    *,
    max_groups: int,
    group_size: int,
    current_version: str | None,
    max_staleness: int,
    batch: int = 32,
) -> Claim:
    """Up to ``max_groups`` groups kept for ``run_id``, oldest first, and what was dropped on the way."""
    claim = Claim()
    with session_scope() as session:
        order = list(session.scalars(select(ModelVersion.id).where(ModelVersion.role == role).order_by(ModelVersion.created_at)))
    while len(claim.groups) < max_groups:
        with session_scope() as session:
            candidates = list(
                session.scalars(
                    select(RolloutGroup.id)
                    .where(RolloutGroup.role == role, RolloutGroup.claimed_by.is_(None))
                    .order_by(RolloutGroup.created_at, RolloutGroup.id)
                    .limit(batch)
                )
            )
        if not candidates:
            return claim
        for group_id in candidates:
            if len(claim.groups) >= max_groups:
                break
            lag = functools.partial(version_lag, order, current_version)
            kept, reason = _take(run_id, group_id, group_size, lag, max_staleness)
            if kept is not None:
                claim.groups.append(kept)
            elif reason is not None:
                claim.dropped[reason] += 1
    return claim


def _take(
    run_id: str, group_id: str, group_size: int, lag: Callable[[str | None], int], max_staleness: int
) -> tuple[ClaimedGroup | None, str | None]:
    """Claim one group (None, None: another run has it) and keep it, or drop it with the reason."""
    with session_scope() as session:
        taken = session.execute(
            update(RolloutGroup)
            .where(RolloutGroup.id == group_id, RolloutGroup.claimed_by.is_(None))
            .values(claimed_by=run_id, claimed_at=datetime.now(UTC))
        )
        if taken.rowcount != 1:  # type: ignore[attr-defined]  # an UPDATE's result is a CursorResult
            return None, None
        group = session.get_one(RolloutGroup, group_id)
        rows = list(session.scalars(select(Rollout).where(Rollout.group_id == group_id).order_by(Rollout.created_at, Rollout.id)))
        rewards = [r.reward for r in rows]
        if len(rows) != group_size:
            reason: str | None = "size"
        elif lag(group.model_version_id) > max_staleness:
            reason = "stale"
        elif any(r.status == UNSCORED or r.reward is None for r in rows):
            reason = UNSCORED
        elif len(set(rewards)) == 1:
            reason = "no_signal"
        else:
            reason = None
        if reason is not None:
            group.dropped = reason
            return None, reason
        advantages = group_advantages([float(r) for r in rewards if r is not None])
        samples = [
            ClaimedSample(r.prompt, r.completion, r.completion_ids, r.behaviour_logps, float(r.reward or 0.0), a)
            for r, a in zip(rows, advantages, strict=True)
        ]
        return ClaimedGroup(group.id, group.model_version_id, samples), None

"""Rollout intake and claiming on both databases: whole groups, once, also with two runs racing; stale,
unscored, all-alike and wrong-size groups dropped with the reason; advantages from the one function."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import select

from reward_svc import group_advantages
from services.config import Settings
from services.db import migrate
from services.db.models import ModelVersion, RolloutGroup
from services.db.session import session_scope
from trainer.rollouts import UNSCORED, Sample, claim_groups, record_group


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, kz_env: Callable[..., Settings], tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'rollouts.db'}" if request.param == "sqlite" else request.getfixturevalue("postgres_url")
    kz_env(database_url=url)
    migrate.upgrade()
    return url


def group(rewards: list[float | None], tag: str = "") -> list[Sample]:
    return [
        Sample(f"prompt{tag}", f"completion {i}{tag}", UNSCORED if r is None else "correct" if r else "incorrect", r)
        for i, r in enumerate(rewards)
    ]


def version(name: str) -> str:
    with session_scope() as session:
        row = ModelVersion(role="coder", name=name)
        session.add(row)
        session.flush()
        return row.id


def test_groups_are_claimed_whole_and_once_and_filtered_with_the_reason(database: str) -> None:
    v1 = version("v1")
    time.sleep(0.01)  # versions are ordered by when they were made
    v2, v3 = version("v2"), None
    time.sleep(0.01)
    v3 = version("v3")
    kept = record_group("coder", group([1.0, 0.0, 0.0, 1.25]), model_version_id=v3)
    record_group("coder", group([1.0, 0.0, 1.0, 0.0], "old"), model_version_id=v1)  # two versions behind: K=1 drops it
    record_group("coder", group([0.0, 0.0, 0.0, 0.0]), model_version_id=v3)  # no signal
    record_group("coder", group([1.0, None, 0.0, 1.0]), model_version_id=v3)  # the reward service failed on one
    record_group("coder", group([1.0, 0.0]), model_version_id=v2)  # not the run's group size
    behind = record_group("coder", group([0.0, 1.0, 1.0, 1.0], "behind"), model_version_id=v2)  # one behind: kept

    claim = claim_groups("run-a", "coder", max_groups=10, group_size=4, current_version=v3, max_staleness=1)
    assert [g.id for g in claim.groups] == [kept, behind]
    assert claim.dropped == {"stale": 1, "no_signal": 1, UNSCORED: 1, "size": 1}
    first = claim.groups[0]
    assert [s.reward for s in first.samples] == [1.0, 0.0, 0.0, 1.25]
    assert [s.advantage for s in first.samples] == pytest.approx(group_advantages([1.0, 0.0, 0.0, 1.25]))
    assert claim_groups("run-b", "coder", max_groups=10, group_size=4, current_version=v3, max_staleness=1).groups == []
    with session_scope() as session:
        rows = {g.id: (g.claimed_by, g.dropped) for g in session.scalars(select(RolloutGroup))}
    assert all(claimed == "run-a" for claimed, _ in rows.values())
    assert sorted(dropped for _, dropped in rows.values() if dropped) == ["no_signal", "size", "stale", UNSCORED]


def test_a_group_recorded_twice_under_its_id_is_stored_once(database: str) -> None:
    first = record_group("coder", group([1.0, 0.0]), group_id="job-7:task-3")
    again = record_group("coder", group([0.0, 0.0]), group_id="job-7:task-3")  # the same job, delivered again
    assert first == again == "job-7:task-3"
    claim = claim_groups("run", "coder", max_groups=5, group_size=2, current_version=None, max_staleness=0)
    assert [[s.reward for s in g.samples] for g in claim.groups] == [[1.0, 0.0]]


def test_two_runs_racing_never_share_a_group(database: str) -> None:
    expected = {record_group("coder", group([float(i % 2), float((i + 1) % 2)], str(i))) for i in range(24)}
    taken: dict[str, list[str]] = {"a": [], "b": []}
    start = threading.Barrier(2)

    def run(name: str) -> None:
        start.wait()
        while True:
            claim = claim_groups(name, "coder", max_groups=2, group_size=2, current_version=None, max_staleness=0, batch=4)
            if not claim.groups:
                return
            taken[name] += [g.id for g in claim.groups]

    threads = [threading.Thread(target=run, args=(name,)) for name in taken]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not set(taken["a"]) & set(taken["b"])
    assert set(taken["a"]) | set(taken["b"]) == expected
    assert len(taken["a"]) + len(taken["b"]) == len(expected)

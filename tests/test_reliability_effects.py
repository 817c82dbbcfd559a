"""Exactly-once effects: a worker killed in each window between a job's writes and its end, at
deterministic fault points (``services.queue.faults``); the job ends once, succeeded, with one set of
rows, and its attempts counted.

Each test runs real worker processes (``tests/fault_apps``: the service's real job body, bookkeeping,
database writes and queue, with a stand-in for the slow part) with ``KZ_FAULT_POINT`` naming every
window of its job. Each point fires once, in order: the first attempt dies in the first window, the
second in the next, and so on, so every attempt faces what the dead one before it left. The sweeper
sends the job again as soon as it sees the dead owner's process gone (Celery puts the dead child's
message back too, once its parent notices, which takes up to seconds); the next attempt takes the job
over from its dead owner. Two workers of the service run, so one is free while the other's parent
is still noticing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from reward_cases import RELU_REFERENCE
from servers import serve
from services.config import Settings, get_settings
from services.db.models import Candidate, Job, JobCheckpoint, Score, Task, TrainingRun
from services.db.session import session_scope
from services.queue.jobs import get_job, submit_job
from services.queue.names import SCORE_GROUP_TASK, TRAIN_ROUND_TASK, TRAINING
from services.schemas.coder import KernelRequest, KernelResult
from services.schemas.proposer import ProposeRequest, ProposeSummary
from services.schemas.reward import GroupScoreRequest
from trainer.config import LoopConfig

# Fast enough for a test, in the proportions the settings demand. Every worker here dies by SIGKILL, which
# the sweeper sees at once on this host (the process is gone), so death by silence can wait longer: with
# 1 s, a live attempt whose heartbeat a loaded 2-core CI machine held back a second was given up on.
FAST = {"worker_heartbeat_s": 0.2, "worker_dead_after_s": 5.0, "queued_grace_s": 1.0, "sweep_interval_s": 0.2}


def start_workers(start_worker: Callable[..., Any], service: str, count: int = 2, **fields: object) -> None:
    """``count`` workers of ``service`` (``fault_apps.<service>``), started side by side."""
    with ThreadPoolExecutor(count) as starting:
        for worker in [starting.submit(start_worker, service, app=f"fault_apps.{service}", **fields) for _ in range(count)]:
            worker.result()


def finished(job_id: str, timeout_s: float = 60) -> Job:
    deadline = time.monotonic() + timeout_s
    while (job := get_job(job_id)).status not in ("succeeded", "failed"):
        if time.monotonic() > deadline:
            pytest.fail(f"job {job_id} still {job.status} (attempts {job.attempts}) after {timeout_s} s")
        time.sleep(0.05)
    return job


def fired(windows: list[str]) -> list[str]:
    """The fault points that killed a worker (each leaves its marker)."""
    return [w for w in windows if (get_settings().data_dir / "faults" / w).exists()]


def count(model: Any, *where: Any) -> int:
    with session_scope() as session:
        return int(session.scalar(select(func.count()).select_from(model).where(*where)) or 0)


def test_a_scoring_job_killed_in_each_window_stores_one_group(
    platform_env: Callable[..., Settings], start_worker: Callable[..., Any]
) -> None:
    """The known double: killed after its verdicts were stored and before the job ended, the next
    attempt stored a second group (its candidates, its scores) that the frontier counted too."""
    from proposer_svc.frontier import task_pass_rates
    from reward_svc.service import submit_group

    windows = ["score.after_task", "job.before_finish"]
    platform_env(max_job_attempts=len(windows) + 1, **FAST)
    start_workers(start_worker, "reward", fault_point=",".join(windows))
    job = submit_group(GroupScoreRequest(reference=RELU_REFERENCE, candidates=["correct 1", "wrong 2", "correct 3"]))

    done = finished(job.id)
    assert (done.status, done.attempts, fired(windows)) == ("succeeded", len(windows) + 1, windows), done.error
    assert done.result is not None and done.result["group_id"] == job.id
    with session_scope() as session:
        scores = list(session.scalars(select(Score).where(Score.job_id == job.id).order_by(Score.item)))
        assert [(s.item, s.correct, s.group_id) for s in scores] == [(0, True, job.id), (1, False, job.id), (2, True, job.id)]
        assert [s.candidate.source for s in scores] == ["correct 1", "wrong 2", "correct 3"]
    assert (count(Candidate), count(Score), count(Task)) == (3, 3, 1)
    [rate] = task_pass_rates()
    assert (rate.scored, rate.correct) == (3, 2)  # what the frontier sees: the group once


@pytest.mark.slow  # the reward service's API in a process, and two workers
def test_a_generation_job_killed_in_each_window_scores_the_candidates_it_drew_once(
    platform_env: Callable[..., Settings], start_worker: Callable[..., Any], free_port: Callable[[], int]
) -> None:
    """A sampling model draws new candidates at every call: an attempt that sampled again would score a
    second group under a second reward job. The first attempt's draws are the job's checkpoint."""
    from coder_svc.service import submit

    windows = ["generate.after_drafts", "generate.after_scoring", "job.before_finish"]
    port = free_port()
    platform_env(auth_enabled="false", reward_port=port, max_job_attempts=len(windows) + 1, **FAST)
    with ThreadPoolExecutor(2) as starting, serve("reward_svc.api:app", port):  # all side by side
        workers = [
            starting.submit(start_workers, start_worker, "reward", count=1),
            starting.submit(start_workers, start_worker, "coder", fault_point=",".join(windows)),
        ]
        for worker in workers:
            worker.result()
        job = submit(KernelRequest(module=RELU_REFERENCE, n=4, wait_s=0))
        done = finished(job.id)

    assert (done.status, done.attempts, fired(windows)) == ("succeeded", len(windows) + 1, windows), done.error
    result = KernelResult.model_validate(done.result)
    with session_scope() as session:
        drawn = [d["source"] for d in session.get_one(JobCheckpoint, (job.id, "drafts")).value]
        reward_jobs = list(session.scalars(select(Job.id).where(Job.kind == SCORE_GROUP_TASK)))
        rows = list(session.scalars(select(Candidate).join(Score).order_by(Score.item)))
        assert [r.source for r in rows] == drawn
        assert {r.details["coder_job_id"] for r in rows if r.details} == {job.id} and all(r.details for r in rows)
    assert [c.source for c in result.candidates] == drawn and len(set(drawn)) == 4
    assert reward_jobs == [result.reward_job_id]  # one scored group for the job, not one per attempt
    assert (count(Candidate), count(Score)) == (4, 4)
    assert result.correct_fraction == 0.5


def test_a_proposal_job_killed_in_each_window_stores_and_reports_its_modules_once(
    platform_env: Callable[..., Settings], start_worker: Callable[..., Any]
) -> None:
    """Killed between storing its modules (or after the last), the next attempt used to find them in the
    pool and report them as "exists": a valid module turned into the Proposer's penalty."""
    from proposer_svc.service import submit_propose

    windows = ["propose.after_store", "job.before_finish"]
    platform_env(max_job_attempts=len(windows) + 1, proposer_corpus="none-mined", **FAST)
    start_workers(start_worker, "proposer", fault_point=",".join(windows))
    job = submit_propose(ProposeRequest(count=3, seed=7))

    done = finished(job.id)
    assert (done.status, done.attempts, fired(windows)) == ("succeeded", len(windows) + 1, windows), done.error
    summary = ProposeSummary.model_validate(done.result)
    with session_scope() as session:
        tasks = {t.id: t.job_id for t in session.scalars(select(Task))}
    assert summary.exists == 0 and summary.valid + summary.declined == 3 and summary.valid >= 2
    assert {p.task_id for p in summary.proposals if p.status == "valid"} == set(tasks)
    assert set(tasks.values()) == {job.id}


def test_a_round_job_killed_after_its_round_queues_the_next_round_once(
    platform_env: Callable[..., Settings], start_worker: Callable[..., Any], tmp_path: Path
) -> None:
    """Killed after the run recorded its round and before the next round was queued, the next attempt
    played nothing (the round was done) and queued nothing: the run stayed "running" for ever."""
    windows = ["train.after_round", "job.before_finish"]
    platform_env(max_job_attempts=len(windows) + 1, **FAST)
    # One worker: with two, the next round could reach job.before_finish first and die there instead.
    start_workers(start_worker, "trainer", count=1, fault_point=",".join(windows))
    config = LoopConfig.model_validate({"coder": {"model_path": str(tmp_path)}, "rounds": 2})
    with session_scope() as session:
        run = TrainingRun(config=config.model_dump(mode="json"), run_dir=str(tmp_path / "run"))
        session.add(run)
    first = submit_job(TRAIN_ROUND_TASK, {"run_id": run.id, "round": 0}, TRAINING)

    deadline = time.monotonic() + 60
    while (status := session_run(run.id)).status not in ("succeeded", "failed"):
        assert time.monotonic() < deadline, f"run still {status.status} after round {status.rounds_done}"
        time.sleep(0.05)
    assert (status.status, status.rounds_done) == ("succeeded", 2), status.error
    assert finished(first.id).attempts == len(windows) + 1 and fired(windows) == windows
    with session_scope() as session:
        rounds = list(session.scalars(select(Job).where(Job.kind == TRAIN_ROUND_TASK).order_by(Job.created_at)))
    assert [(j.payload["round"], j.status, j.attempts) for j in rounds] == [(0, "succeeded", 3), (1, "succeeded", 1)]
    assert (get_settings().data_dir / "played-rounds").read_text().split() == ["0", "1"]  # each round played once


def session_run(run_id: str) -> TrainingRun:
    with session_scope() as session:
        return session.get_one(TrainingRun, run_id)

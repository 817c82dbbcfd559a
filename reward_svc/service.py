"""The reward service's logic behind its routes, its Celery task and its CLI: score, reward, persist."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import redis

from reward_svc.evaluate import Evaluation, Evaluator
from reward_svc.rewards import group_rewards
from services.api import waiting
from services.config import get_settings
from services.db.models import Candidate, Job, Score, derived_id
from services.db.session import session_scope
from services.db.tasks import ensure_task, source_sha256
from services.metrics import VERDICTS
from services.queue.faults import fault_point
from services.queue.jobs import submit_job
from services.queue.names import SCORE_GROUP_TASK, scoring_queues
from services.rl_samples import Sample, completion_after_prompt, in_batch_order, regroup
from services.schemas.jobs import FINISHED
from services.schemas.reward import (
    CAGRPOConfig,
    GroupResult,
    GroupScoreRequest,
    GroupScoreResponse,
    RemoteRewardRequest,
    RemoteRewardResponse,
    ScoredVerdict,
    ScoreOptions,
)


def rewarded_group(evaluation: Evaluation, config: CAGRPOConfig) -> GroupResult:
    """Verdicts with their CA-GRPO rewards and advantages."""
    correct = [v.correct for v in evaluation.verdicts]
    rewards = group_rewards(correct, [v.speedup for v in evaluation.verdicts], config)
    verdicts = [
        ScoredVerdict(**dataclasses.asdict(v), reward=r, advantage=a, device=evaluation.device)
        for v, r, a in zip(evaluation.verdicts, rewards.rewards, rewards.advantages, strict=True)
    ]
    return GroupResult(verdicts=verdicts, correct_fraction=rewards.correct_fraction, speed_rewarded=rewards.speed_rewarded)


def score_group(request: GroupScoreRequest, evaluator: Evaluator) -> GroupResult:
    evaluation = evaluator.evaluate_group(request.reference, request.candidates, request.options)
    return rewarded_group(evaluation, request.ca_grpo)


def persist_group(request: GroupScoreRequest, result: GroupResult, job_id: str) -> str:
    """Store the reference as a task, each candidate, and each verdict; returns the group id (the job's).

    Each row's id derives from the job and the candidate's index, so an attempt run again after its
    worker died (between this write and the job's end) rewrites the same rows with its verdicts
    instead of adding a second group that the frontier would count too."""
    task_id = ensure_task(request.reference, origin="external")
    fault_point("score.after_task")
    with session_scope() as session:
        for item, (source, verdict) in enumerate(zip(request.candidates, result.verdicts)):
            candidate = Candidate(
                id=derived_id(job_id, "candidate", item),
                task_id=task_id,
                backend=request.options.backend,
                source=source,
                source_hash=source_sha256(source),
            )
            session.merge(candidate)  # what the Coder added to a row (who wrote it) stays
            session.merge(
                Score(
                    id=derived_id(job_id, "score", item),
                    candidate_id=candidate.id,
                    job_id=job_id,
                    item=item,
                    group_id=job_id,
                    status=verdict.status,
                    correct=verdict.correct,
                    reason=verdict.reason,
                    guard=verdict.guard,
                    reward=verdict.reward,
                    advantage=verdict.advantage,
                    speedup=verdict.speedup,
                    runtime_ms=verdict.runtime_ms,
                    ref_runtime_ms=verdict.ref_runtime_ms,
                    max_abs_error=verdict.max_abs_error,
                    device=verdict.device,
                    details=verdict.details,
                )
            )
    return job_id


def pick_scoring_queue() -> str:
    """The least busy device queue (one worker per GPU; CPU-only deployments have one queue)."""
    settings = get_settings()
    queues = scoring_queues(settings.gpu_devices)
    if len(queues) == 1:
        return queues[0]
    client = redis.Redis.from_url(settings.redis_url)
    return min(queues, key=lambda q: int(client.llen(q)))


def submit_group(request: GroupScoreRequest) -> Job:
    payload = request.model_dump(exclude={"wait_s"})
    return submit_job(SCORE_GROUP_TASK, payload, pick_scoring_queue())


def run_score_job(evaluator: Evaluator, job_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    """The Celery job body: evaluate, reward, persist, return the result stored on the job."""
    request = GroupScoreRequest.model_validate(payload)
    result = score_group(request, evaluator)
    group_id = persist_group(request, result, job_id)
    for verdict in result.verdicts:
        VERDICTS.labels(verdict.status, verdict.guard or "none").inc()
    return {**result.model_dump(), "group_id": group_id}


class StillScoring(RuntimeError):
    """A group's job had not finished when the caller's wait ran out (its id, to ask again)."""

    def __init__(self, job_ids: list[str]) -> None:
        super().__init__(f"still scoring (jobs {', '.join(job_ids)}); the same request again picks up the same jobs")
        self.job_ids = job_ids


def remote_rewards(
    request: RemoteRewardRequest, options: ScoreOptions, ca_grpo: CAGRPOConfig, wait_s: float
) -> RemoteRewardResponse:
    """OpenRLHF's ``/get_reward``: each query's kernel (after its prompt) scored within its prompt's group,
    one scoring job per group; ``StillScoring`` when a job outlives ``wait_s``."""
    prompts: list[str | None] = list(request.prompts) if request.prompts else [None] * len(request.query)
    samples = [
        Sample(prompt, label, completion_after_prompt(query, prompt), options.backend)
        for query, prompt, label in zip(request.query, prompts, request.labels)
    ]
    groups = regroup(samples)
    jobs = [
        submit_group(GroupScoreRequest(reference=g.reference, candidates=g.candidates, options=options, ca_grpo=ca_grpo)).id
        if g.candidates
        else None
        for g in groups
    ]
    deadline = time.monotonic() + wait_s
    answers: list[GroupScoreResponse | None] = []
    for job_id in jobs:
        if job_id is None:
            answers.append(None)
            continue
        job = waiting.wait_until_done(job_id, max(0.0, deadline - time.monotonic()))  # the routes' one wait
        result = GroupResult.model_validate(job.result) if job.status == "succeeded" and job.result else None
        answers.append(GroupScoreResponse(job_id=job.id, job_status=job.status, result=result, error=job.error))
    unfinished = [a.job_id for a in answers if a is not None and a.job_status not in FINISHED]
    if unfinished:
        raise StillScoring(unfinished)
    scores = in_batch_order(samples, groups, answers)
    return RemoteRewardResponse(
        rewards=[s.reward if s.reward is not None else 0.0 for s in scores],
        scores=[float(s.correct) for s in scores],
        extra_logs={
            "correct": [float(s.correct) for s in scores],
            "scored": [float(s.reward is not None) for s in scores],
            "speedup": [(s.verdict.speedup or 0.0) if s.verdict else 0.0 for s in scores],
        },
    )

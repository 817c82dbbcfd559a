"""The reward service's logic behind its routes, its Celery task and its CLI: score, reward, persist."""

from __future__ import annotations

import dataclasses
from typing import Any

import redis

from reward_svc.evaluate import Evaluation, Evaluator
from reward_svc.rewards import group_rewards
from services.config import get_settings
from services.db.models import Candidate, Job, Score, derived_id
from services.db.session import session_scope
from services.db.tasks import ensure_task, source_sha256
from services.metrics import VERDICTS
from services.queue.faults import fault_point
from services.queue.jobs import submit_job
from services.queue.names import SCORE_GROUP_TASK, scoring_queues
from services.schemas.reward import CAGRPOConfig, GroupResult, GroupScoreRequest, ScoredVerdict


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

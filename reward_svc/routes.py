"""Reward HTTP routes: thin: schema in, service function, schema out."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response

from services.auth import require_api_key
from services.db.models import Job
from services.queue.jobs import wait_until_done
from services.schemas.reward import GroupResult, GroupScoreRequest, GroupScoreResponse, ScoreRequest, ScoreResponse
from reward_svc import service

router = APIRouter(tags=["reward"], dependencies=[Depends(require_api_key)])


@router.post("/score", response_model=ScoreResponse, responses={202: {"model": ScoreResponse}})
def score(request: ScoreRequest, response: Response) -> ScoreResponse:
    """Score one candidate. Waits up to ``wait_s`` for the verdict, else answers 202 with the job id."""
    group = GroupScoreRequest(reference=request.reference, candidates=[request.candidate], options=request.options, wait_s=request.wait_s)
    job = _submit_and_wait(group, response)
    verdict = GroupResult.model_validate(job.result).verdicts[0] if job.result else None
    return ScoreResponse(job_id=job.id, job_status=job.status, verdict=verdict, error=job.error)


@router.post("/score/group", response_model=GroupScoreResponse, responses={202: {"model": GroupScoreResponse}})
def score_group(request: GroupScoreRequest, response: Response) -> GroupScoreResponse:
    """Score G candidates for one reference: verdicts plus CA-GRPO rewards and advantages."""
    job = _submit_and_wait(request, response)
    result = GroupResult.model_validate(job.result) if job.result else None
    return GroupScoreResponse(job_id=job.id, job_status=job.status, result=result, error=job.error)


def _submit_and_wait(request: GroupScoreRequest, response: Response) -> Job:
    """The job after up to ``wait_s``; still running means 202 with its id."""
    job = wait_until_done(service.submit_group(request).id, request.wait_s)
    if job.status not in ("succeeded", "failed"):
        response.status_code = 202
    return job

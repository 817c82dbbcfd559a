"""Reward HTTP routes: thin: schema in, service function, schema out."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response

from reward_svc import service
from services.api.errors import error_answers
from services.api.quota import charge
from services.api.strict_json import StrictJSONRoute
from services.api.waiting import job_after_wait
from services.auth import require_api_key
from services.schemas.reward import GroupResult, GroupScoreRequest, GroupScoreResponse, ScoreRequest, ScoreResponse

router = APIRouter(tags=["reward"], dependencies=[Depends(require_api_key)], route_class=StrictJSONRoute)


@router.post("/score", response_model=ScoreResponse, responses={202: {"model": ScoreResponse}, **error_answers(429, 503)})
def score(request: ScoreRequest, response: Response, http: Request) -> ScoreResponse:
    """Score one candidate. Waits up to ``wait_s`` for the verdict, else answers 202 with the job id."""
    charge(http, "scored_candidates", 1)
    group = GroupScoreRequest(
        reference=request.reference, candidates=[request.candidate], options=request.options, wait_s=request.wait_s
    )
    job = job_after_wait(service.submit_group(group).id, group.wait_s, response)
    verdict = GroupResult.model_validate(job.result).verdicts[0] if job.result else None
    return ScoreResponse(job_id=job.id, job_status=job.status, verdict=verdict, error=job.error)


@router.post(
    "/score/group", response_model=GroupScoreResponse, responses={202: {"model": GroupScoreResponse}, **error_answers(429, 503)}
)
def score_group(request: GroupScoreRequest, response: Response, http: Request) -> GroupScoreResponse:
    """Score G candidates for one reference: verdicts plus CA-GRPO rewards and advantages."""
    charge(http, "scored_candidates", len(request.candidates))
    job = job_after_wait(service.submit_group(request).id, request.wait_s, response)
    result = GroupResult.model_validate(job.result) if job.result else None
    return GroupScoreResponse(job_id=job.id, job_status=job.status, result=result, error=job.error)

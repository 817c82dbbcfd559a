"""Reward HTTP routes: thin: schema in, service function, schema out."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response

from reward_svc import service
from services.api.errors import error_answers
from services.api.quota import charge
from services.api.strict_json import StrictJSONRoute
from services.api.waiting import job_after_wait
from services.auth import require_api_key
from services.schemas.coder import KernelBackendName
from services.schemas.errors import ErrorAnswer
from services.schemas.reward import (
    CAGRPOConfig,
    GroupResult,
    GroupScoreRequest,
    GroupScoreResponse,
    RemoteRewardRequest,
    RemoteRewardResponse,
    ScoreDevice,
    ScoreOptions,
    ScoreRequest,
    ScoreResponse,
)

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


@router.post(
    "/get_reward",
    response_model=RemoteRewardResponse,
    responses={
        **error_answers(429),
        503: {
            "model": ErrorAnswer,
            "description": "the groups are still being scored (Retry-After); the same request picks them up",
        },
    },
)
def get_reward(
    request: RemoteRewardRequest,
    http: Request,
    backend: Annotated[KernelBackendName, Query(description="The kernels' language: triton or cuda.")] = "triton",
    device: Annotated[ScoreDevice, Query(description="Where to run them: auto, cpu or cuda.")] = "auto",
    wait_s: Annotated[
        float, Query(ge=0, le=600, description="How long to wait for the verdicts (OpenRLHF gives up at 180 s).")
    ] = 170.0,
) -> RemoteRewardResponse:
    """OpenRLHF's remote reward protocol (``--remote_rm_url http://HOST:8103/v1/get_reward?key=KEY``): each
    query's kernel, after its prompt, scored within its prompt's group; labels are the reference modules.
    OpenRLHF's client sends no headers, so this route also takes the API key as ``?key=``."""
    charge(http, "scored_candidates", len(request.query))
    try:
        return service.remote_rewards(request, ScoreOptions(backend=backend, device=device), CAGRPOConfig(), wait_s)
    except service.StillScoring as exc:
        raise HTTPException(503, str(exc), headers={"Retry-After": "1"}) from None

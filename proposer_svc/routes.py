"""Proposer HTTP routes: thin: schema in, service function, schema out."""

from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response

from proposer_svc import service
from services.api.errors import error_answers
from services.api.quota import charge
from services.api.strict_json import StrictJSONRoute
from services.api.waiting import job_after_wait
from services.auth import require_api_key
from services.schemas.proposer import FrontierOut, ProposeRequest, ProposeResponse, ProposeSummary, TaskOut, TaskPage, TaskStatus

router = APIRouter(tags=["proposer"], dependencies=[Depends(require_api_key)], route_class=StrictJSONRoute)


@router.post(
    "/tasks/propose", response_model=ProposeResponse, responses={202: {"model": ProposeResponse}, **error_answers(400, 429, 503)}
)
def propose(request: ProposeRequest, response: Response, http: Request) -> ProposeResponse:
    """Queue a proposal round. Waits up to ``wait_s`` for its summary (200), else answers 202 with the job id."""
    charge(http, "proposed_modules", request.count * request.group_size)
    try:
        submitted = service.submit_propose(request)
    except service.ComposerUnavailable as exc:
        raise HTTPException(400, str(exc)) from None
    job = job_after_wait(submitted.id, request.wait_s, response)
    result = ProposeSummary.model_validate(job.result) if job.result else None
    return ProposeResponse(job_id=job.id, job_status=job.status, result=result, error=job.error)


@router.get("/tasks", response_model=TaskPage)
def list_tasks(
    status: TaskStatus | None = Query(None, description="valid, rejected, reference or pending"),
    origin: str | None = Query(None, max_length=50, description="composer, llm:<model>, external"),
    limit: int = Query(50, ge=1, le=500),
    offset: int = Query(0, ge=0, lt=2**63, description="Tasks skipped; the database's integers are 64-bit."),
) -> TaskPage:
    return service.list_tasks(status, origin, limit, offset)


@router.get("/tasks/{task_id}", response_model=TaskOut, responses=error_answers(404))
def get_task(task_id: str) -> TaskOut:
    task = service.get_task(task_id)
    if task is None:
        raise HTTPException(404, f"no task with id {task_id}")
    return task


@router.get("/frontier", response_model=FrontierOut)
def frontier(
    count: int = Query(20, ge=0, le=500, description="Tasks to select for the next round."),
    bins: int = Query(10, ge=1, le=100, description="Pass-rate histogram bins."),
) -> FrontierOut:
    return service.frontier(count, bins)

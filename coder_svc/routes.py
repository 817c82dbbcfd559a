"""Coder HTTP routes: thin: schema in, service function, schema out."""

from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException, Request, Response

from coder_svc import service
from services.api.errors import error_answers
from services.api.quota import charge
from services.api.strict_json import StrictJSONRoute
from services.api.waiting import job_after_wait
from services.auth import require_api_key
from services.queue.jobs import JobNotFound
from services.schemas.coder import KernelRequest, KernelResponse

router = APIRouter(tags=["coder"], dependencies=[Depends(require_api_key)], route_class=StrictJSONRoute)


@router.post("/kernels", response_model=KernelResponse, responses={202: {"model": KernelResponse}, **error_answers(429, 503)})
def request_kernel(request: KernelRequest, response: Response, http: Request) -> KernelResponse:
    """Best-of-n kernel for a module. Waits up to ``wait_s`` for the result, else answers 202 with the job id."""
    charge(http, "kernel_candidates", request.n)
    job = job_after_wait(service.submit(request).id, request.wait_s, response)
    return service.kernel_response(job)


@router.get("/kernels/{job_id}", response_model=KernelResponse, responses=error_answers(404))
def read_kernel(job_id: str) -> KernelResponse:
    """Status, the best verified kernel with its speedup, every candidate's verdict, the model."""
    try:
        return service.kernel_response(service.generation_job(job_id))
    except JobNotFound:
        raise HTTPException(404, f"no kernel job with id {job_id}") from None

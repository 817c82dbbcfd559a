"""Routes every service has: read a job, and submit a probe job to the service's own worker."""

from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException

from services.api.errors import error_answers
from services.api.strict_json import StrictJSONRoute
from services.auth import require_api_key
from services.config import get_settings
from services.queue.jobs import JobNotFound, get_job, submit_job
from services.queue.names import probe_task_name, service_queues
from services.schemas.jobs import JobOut, ProbeIn


def jobs_router(service: str) -> APIRouter:
    router = APIRouter(tags=["jobs"], dependencies=[Depends(require_api_key)], route_class=StrictJSONRoute)

    @router.get("/jobs/{job_id}", response_model=JobOut, responses=error_answers(404))
    def read_job(job_id: str) -> JobOut:
        try:
            return JobOut.model_validate(get_job(job_id))
        except JobNotFound:
            raise HTTPException(404, f"no job with id {job_id}") from None

    @router.post("/probe", response_model=JobOut, status_code=202)
    def probe(body: ProbeIn) -> JobOut:
        queue = service_queues(service, get_settings().gpu_devices)[0]
        return JobOut.model_validate(submit_job(probe_task_name(service), body.model_dump(), queue))

    return router

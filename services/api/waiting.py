"""How a job-backed route answers: after waiting up to the request's ``wait_s`` for its job, 200 with
the result when it finished, 202 with the job's id while it still runs (``GET /v1/jobs/{id}`` or the
service's own read route has it later)."""

from __future__ import annotations

from fastapi import Response

from services.db.models import Job
from services.queue.jobs import wait_until_done
from services.schemas.jobs import FINISHED


def job_after_wait(job_id: str, wait_s: float, response: Response) -> Job:
    job = wait_until_done(job_id, wait_s)
    if job.status not in FINISHED:
        response.status_code = 202
    return job

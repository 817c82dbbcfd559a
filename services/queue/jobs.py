"""Jobs: idempotent submission, the attempt counter and the lifecycle every Celery task follows.

A job's id doubles as its Celery task id and is derived from its input, so submitting the same
input twice returns the same job and does the work once. A redelivered job (its worker died)
counts another attempt; past ``max_job_attempts`` it is reported failed, never lost.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import structlog
from celery import Celery, Task
from sqlalchemy import delete, update
from sqlalchemy.exc import IntegrityError

from services.config import get_settings
from services.db.models import Job
from services.db.session import session_scope
from services.queue.app import producer
from services.schemas.jobs import FINISHED

log = structlog.get_logger(__name__)

JobFunction = Callable[[str, dict[str, Any]], dict[str, Any]]


class JobNotFound(LookupError):
    pass


def idempotency_key(kind: str, payload: dict[str, Any]) -> str:
    canonical = json.dumps({"kind": kind, "payload": payload}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def job_id_for(key: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"kernelzero:{key}"))


def submit_job(kind: str, payload: dict[str, Any], queue: str, app: Celery | None = None) -> Job:
    """Record the job and enqueue it, unless the same input was submitted before."""
    key = idempotency_key(kind, payload)
    job_id = job_id_for(key)
    with session_scope() as session:
        existing = session.get(Job, job_id)
        if existing is not None:
            return existing
    try:
        with session_scope() as session:
            job = Job(id=job_id, kind=kind, queue=queue, idempotency_key=key, payload=payload, status="queued", attempts=0)
            session.add(job)
    except IntegrityError:  # a concurrent submission of the same input won the race
        return get_job(job_id)
    try:
        (app or producer()).send_task(kind, args=[job_id], queue=queue, task_id=job_id)
    except Exception:
        # Not enqueued (Redis down): drop the record, or a resubmission would find a "queued"
        # job that no message will ever run.
        with session_scope() as session:
            session.execute(delete(Job).where(Job.id == job_id, Job.status == "queued"))
        raise
    log.info("job.submitted", job_id=job_id, kind=kind, queue=queue)
    return job


def get_job(job_id: str) -> Job:
    with session_scope() as session:
        job = session.get(Job, job_id)
        if job is None:
            raise JobNotFound(job_id)
        return job


def _begin_attempt(job_id: str) -> tuple[Job | None, str | None]:
    """Count an attempt; return the job to run, or None with the reason to skip it."""
    now = datetime.now(UTC)
    with session_scope() as session:
        job = session.get(Job, job_id)
        if job is None:
            return None, "unknown job"
        if job.status in FINISHED:
            return None, f"already {job.status}"
        job.attempts += 1
        job.status = "running"
        job.started_at = now
        job.worker = f"{socket.gethostname()}:{os.getpid()}"
        if job.attempts > get_settings().max_job_attempts:
            job.status = "failed"
            job.finished_at = now
            job.error = f"gave up after {job.attempts - 1} attempts: its worker died each time"
            return None, job.error
        return job, None


def _finish(job_id: str, status: str, result: dict[str, Any] | None, error: str | None) -> bool:
    """Store the outcome once: a second finisher (a duplicate delivery) changes nothing."""
    with session_scope() as session:
        updated = session.execute(
            update(Job)
            .where(Job.id == job_id, Job.status == "running")
            .values(status=status, result=result, error=error, finished_at=datetime.now(UTC))
        )
        # an UPDATE's result is a CursorResult, which its declared type (Result) does not say
        return updated.rowcount == 1  # type: ignore[attr-defined]


def run_job(job_id: str, work: JobFunction) -> None:
    """The body of every job task: attempt bookkeeping around ``work(job_id, payload)``."""
    structlog.contextvars.bind_contextvars(job_id=job_id)
    try:
        job, skipped = _begin_attempt(job_id)
        if job is None:
            log.info("job.skipped", reason=skipped)
            return
        log.info("job.started", kind=job.kind, attempt=job.attempts)
        try:
            result = work(job_id, job.payload)
        except Exception as exc:  # the job's own failure is a reported outcome, not a crash
            log.exception("job.failed")
            _finish(job_id, "failed", None, f"{type(exc).__name__}: {exc}")
            return
        _finish(job_id, "succeeded", result, None)
        log.info("job.succeeded")
    finally:
        structlog.contextvars.unbind_contextvars("job_id")


class JobTask(Task):
    """Base of every job task: records failures that happen outside ``run_job``'s own handling.

    The hard time limit kills the job's child process, so ``run_job`` never reports it; Celery
    calls ``on_failure`` in the worker's main process and acknowledges the message. Without this
    the job would stay "running" forever.
    """

    def on_failure(self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        if _finish(task_id, "failed", None, f"{type(exc).__name__}: {exc}"):
            log.error("job.failed", job_id=task_id, error=f"{type(exc).__name__}: {exc}")


def register_job_task(app: Celery, kind: str, work: JobFunction) -> None:
    """Register ``work`` as the Celery task named ``kind``; it receives (job_id, payload)."""

    @app.task(name=kind, bind=False, base=JobTask)
    def _task(job_id: str) -> None:
        run_job(job_id, work)


def wait_until_done(job_id: str, wait_s: float, poll_s: float = 0.2) -> Job:
    """The job once it succeeded or failed, or as it stands after ``wait_s`` (routes' submit-and-wait)."""
    deadline = time.monotonic() + wait_s
    job = get_job(job_id)
    while job.status in ("queued", "running") and time.monotonic() < deadline:
        time.sleep(poll_s)
        job = get_job(job_id)
    return job

"""Jobs: idempotent submission, the attempt counter and the lifecycle every Celery task follows.

A job's id doubles as its Celery task id and is derived from its input, so submitting the same
input twice returns the same job and does the work once. A redelivered job (its worker died)
counts another attempt; past ``max_job_attempts`` it is reported failed, never lost.

An attempt claims the job with one conditional update (the row as it was read, or nothing), so two
deliveries never both run it; a delivery that finds the job running on a live owner leaves it be
(``services.queue.liveness``). The owner beats on the row while it runs, and only the owner's attempt
may store the outcome. What a job writes is keyed by the job (and the item), so an attempt that runs
again after a death finds or replaces what the dead one wrote; ``checkpointed`` lets it repeat the
dead attempt's choices (the candidates it sampled) instead of making new ones.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import kombu.exceptions
import redis
import structlog
from celery import Celery, Task
from pydantic import TypeAdapter
from sqlalchemy import update
from sqlalchemy.exc import IntegrityError

from services.config import get_settings
from services.db.models import Job, JobCheckpoint
from services.db.session import retry_while_database_away, session_scope, until_database_answers
from services.metrics import JOB_SECONDS, JOBS
from services.queue import unfit
from services.queue.app import producer
from services.queue.faults import fault_point
from services.queue.liveness import heartbeat, hold, owner_alive, release, worker_name
from services.schemas.jobs import FINISHED

log = structlog.get_logger(__name__)

JobFunction = Callable[[str, dict[str, Any]], dict[str, Any]]
T = TypeVar("T")
CLAIM_TRIES = 3  # each failed claim means another delivery changed the row first: read it again


class JobNotFound(LookupError):
    pass


class BrokerUnavailable(RuntimeError):
    """A job is recorded (``queued``) but its message could not be sent: the sweeper sends it once the
    broker answers and ``KZ_QUEUED_GRACE_S`` has passed, so the request sent again finds the same job."""

    def __init__(self, job_id: str, cause: BaseException) -> None:
        super().__init__(
            f"Redis does not answer ({cause}); job {job_id} is recorded and will be sent once Redis is back: "
            "send the request again to follow it"
        )
        self.job_id = job_id


def idempotency_key(kind: str, payload: dict[str, Any]) -> str:
    canonical = json.dumps({"kind": kind, "payload": payload}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def job_id_for(key: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"kernelzero:{key}"))


def submit_job(kind: str, payload: dict[str, Any], queue: str, app: Celery | None = None) -> Job:
    """Record the job and enqueue it, unless the same input was submitted before. A job recorded while
    Redis was away (``BrokerUnavailable``: sent nowhere, ``enqueued_at`` empty) is sent by the next
    submission of the same input, or by the sweeper once ``KZ_QUEUED_GRACE_S`` has passed."""
    key = idempotency_key(kind, payload)
    job_id = job_id_for(key)
    with session_scope() as session:
        existing = session.get(Job, job_id)
    if existing is not None:
        if existing.status == "queued" and existing.enqueued_at is None:
            _send_unsent(existing, app)
        return existing
    try:
        with session_scope() as session:
            job = Job(
                id=job_id,
                kind=kind,
                queue=queue,
                idempotency_key=key,
                payload=payload,
                status="queued",
                attempts=0,
                enqueued_at=datetime.now(UTC),
            )
            session.add(job)
    except IntegrityError:  # a concurrent submission of the same input won the race
        return get_job(job_id)
    fault_point("submit.after_record", about=job_id)
    _send(job, app)
    log.info("job.submitted", job_id=job_id, kind=kind, queue=queue)
    return job


def _send(job: Job, app: Celery | None) -> None:
    """Send the job's message; if Redis is away, say on the row that it was sent nowhere, and raise
    ``BrokerUnavailable``. The row stays "queued" rather than being deleted: a concurrent submission of
    the same input may have been answered with it already."""
    try:
        (app or producer()).send_task(job.kind, args=[job.id], queue=job.queue, task_id=job.id)
    except (kombu.exceptions.OperationalError, redis.RedisError) as exc:
        log.warning("job.not_sent", job_id=job.id, kind=job.kind, queue=job.queue, error=f"{type(exc).__name__}: {exc}")
        with session_scope() as session:
            session.execute(update(Job).where(Job.id == job.id, Job.status == "queued").values(enqueued_at=None))
        job.enqueued_at = None
        raise BrokerUnavailable(job.id, exc) from exc


def _send_unsent(job: Job, app: Celery | None) -> None:
    """Send a job recorded while Redis was away, if this submission is the one to mark it sent (a
    conditioned update: of concurrent submissions, and the sweeper, one sends)."""
    now = datetime.now(UTC)
    with session_scope() as session:
        marked = session.execute(
            update(Job).where(Job.id == job.id, Job.status == "queued", Job.enqueued_at.is_(None)).values(enqueued_at=now)
        )
        if marked.rowcount != 1:  # type: ignore[attr-defined]  # an UPDATE's result is a CursorResult
            return
    job.enqueued_at = now
    _send(job, app)
    log.info("job.submitted", job_id=job.id, kind=job.kind, queue=job.queue, why="recorded while Redis was away")


def get_job(job_id: str) -> Job:
    with session_scope() as session:
        job = session.get(Job, job_id)
        if job is None:
            raise JobNotFound(job_id)
        return job


@retry_while_database_away  # the database away: wait for it, or the delivery is spent and the job left "queued"
def _begin_attempt(job_id: str) -> tuple[Job | None, str | None]:
    """Count an attempt and claim the job for this process; return the job to run, or None with the
    reason to skip it (finished, unknown, or running on an owner that is alive)."""
    settings = get_settings()
    me = worker_name()
    for _ in range(CLAIM_TRIES):
        now = datetime.now(UTC)
        with session_scope() as session:
            seen = session.get(Job, job_id)
        if seen is None:
            return None, "unknown job"
        if seen.status in FINISHED:
            return None, f"already {seen.status}"
        if seen.status == "running" and owner_alive(
            seen.worker, job_id, seen.attempts, seen.heartbeat_at, now, settings.worker_dead_after_s
        ):
            return None, f"running on {seen.worker}, which is alive"
        attempts = seen.attempts + 1
        values: dict[str, Any] = {"attempts": attempts, "status": "running", "worker": me, "started_at": now, "heartbeat_at": now}
        error = None
        if attempts > settings.max_job_attempts:
            error = f"gave up after {attempts - 1} attempts: its worker died each time"
            values.update(status="failed", finished_at=now, error=error)
        # A fresh transaction whose first statement is this update: on SQLite it takes the write lock
        # and sees every commit before it, on PostgreSQL it waits for a concurrent claim's row lock.
        with session_scope() as session:
            claimed = session.execute(
                update(Job)
                .where(Job.id == job_id, Job.status == seen.status, Job.attempts == seen.attempts)
                .values(**values)
                .execution_options(synchronize_session=False)
            )
            if claimed.rowcount != 1:  # type: ignore[attr-defined]  # an UPDATE's result is a CursorResult
                continue
            job = session.get_one(Job, job_id)
        if error is not None:
            return None, error
        return job, None
    return None, f"claimed by another delivery {CLAIM_TRIES} times while this one looked"


@retry_while_database_away  # the database away: wait for it, or the outcome is lost and the job left "running"
def _finish(
    job_id: str, status: str, result: dict[str, Any] | None, error: str | None, owner: tuple[str, int] | None = None
) -> bool:
    """Store the outcome once: a second finisher (a duplicate delivery) changes nothing. With ``owner``
    (worker, attempt) only while the job is still that attempt's: one that was given up on and sent
    again stores nothing."""
    conditions = [Job.id == job_id, Job.status == "running"]
    if owner is not None:
        conditions += [Job.worker == owner[0], Job.attempts == owner[1]]
    with session_scope() as session:
        updated = session.execute(
            update(Job).where(*conditions).values(status=status, result=result, error=error, finished_at=datetime.now(UTC))
        )
        # an UPDATE's result is a CursorResult, which its declared type (Result) does not say
        return updated.rowcount == 1  # type: ignore[attr-defined]


def run_job(job_id: str, work: JobFunction, kind: str = "unknown") -> None:
    """The body of every job task: attempt bookkeeping around ``work(job_id, payload)``; ``kind`` (the
    task's name, "<service>.<job>") labels its metrics."""
    structlog.contextvars.bind_contextvars(job_id=job_id)
    unfit.exit_when_unfit()  # this process runs jobs: one found unfit ends, and its jobs run again
    started = time.monotonic()
    outcome = "skipped"
    try:
        if not hold(job_id):
            log.info("job.skipped", reason="another delivery of it is running in this process")
            return
        try:
            outcome = _run_attempt(job_id, work)
        finally:
            release(job_id)
    finally:
        structlog.contextvars.unbind_contextvars("job_id")
        service = kind.split(".", 1)[0]
        JOBS.labels(service, kind, outcome).inc()
        if outcome != "skipped":  # a skip's time says nothing about the work
            JOB_SECONDS.labels(service, kind).observe(time.monotonic() - started)


def _run_attempt(job_id: str, work: JobFunction) -> str:
    """Run one attempt; its outcome: succeeded, failed, or skipped (not ours to run, or superseded)."""
    job, skipped = _begin_attempt(job_id)
    if job is None:
        log.info("job.skipped", reason=skipped)
        return "failed" if skipped and skipped.startswith("gave up") else "skipped"
    log.info("job.started", kind=job.kind, attempt=job.attempts)
    owner = (worker_name(), job.attempts)
    with heartbeat(job_id, *owner, get_settings().worker_heartbeat_s):
        try:
            # A job's writes are keyed by the job, so a body whose database went away mid-way runs again once it
            # is back, instead of the job ending "failed" for a connection that was cut.
            result = until_database_answers()(work, job_id, job.payload)
        except Exception as exc:  # the job's own failure is a reported outcome, not a crash
            unfit.check(exc)  # unless it was this process's: then the process ends here, and the job runs again
            log.exception("job.failed")
            _finish(job_id, "failed", None, f"{type(exc).__name__}: {exc}", owner)
            return "failed"
        fault_point("job.before_finish")
        if not _finish(job_id, "succeeded", result, None, owner):
            log.warning("job.superseded", why="given up on while it ran: another attempt owns the job")
            return "skipped"
    log.info("job.succeeded")
    return "succeeded"


def checkpointed(job_id: str, step: str, compute: Callable[[], T], codec: TypeAdapter[T]) -> T:
    """``compute()``'s value as the first attempt of the job to get here stored it: an attempt run
    again after its worker died repeats that attempt's choice (the candidates it sampled, the modules
    it drafted) instead of making new ones, whose effects would come on top of the old ones. Every
    attempt gets the stored JSON form back, so none sees a value the others do not."""
    with session_scope() as session:
        stored = session.get(JobCheckpoint, (job_id, step))
        if stored is not None:
            return codec.validate_python(stored.value)
    value = codec.dump_python(compute(), mode="json")
    try:
        with session_scope() as session:
            session.add(JobCheckpoint(job_id=job_id, step=step, value=value))
    except IntegrityError:  # another attempt stored its own first: that one stands
        with session_scope() as session:
            value = session.get_one(JobCheckpoint, (job_id, step)).value
    return codec.validate_python(value)


class JobTask(Task):
    """Base of every job task: records failures that happen outside ``run_job``'s own handling.

    The hard time limit kills the job's child process, so ``run_job`` never reports it; Celery
    calls ``on_failure`` in the worker's main process and acknowledges the message. Without this
    the job would stay "running" forever.
    """

    def on_failure(self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        if _finish(task_id, "failed", None, f"{type(exc).__name__}: {exc}"):
            log.error("job.failed", job_id=task_id, error=f"{type(exc).__name__}: {exc}")
            JOBS.labels(self.name.split(".", 1)[0], self.name, "failed").inc()  # the hard limit: run_job never got to count it


def register_job_task(app: Celery, kind: str, work: JobFunction) -> None:
    """Register ``work`` as the Celery task named ``kind``; it receives (job_id, payload)."""

    @app.task(name=kind, bind=False, base=JobTask)
    def _task(job_id: str) -> None:
        run_job(job_id, work, kind)


def wait_until_done(job_id: str, wait_s: float, poll_s: float = 0.2) -> Job:
    """The job once it succeeded or failed, or as it stands after ``wait_s`` (routes' submit-and-wait)."""
    deadline = time.monotonic() + wait_s
    job = get_job(job_id)
    while job.status in ("queued", "running") and time.monotonic() < deadline:
        time.sleep(poll_s)
        job = get_job(job_id)
    return job

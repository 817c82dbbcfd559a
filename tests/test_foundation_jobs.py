"""Jobs through a real Celery worker process and the real Redis.

A round trip lands its result in the database; resubmitting an input returns the same job and
does no second piece of work; a job whose worker child is SIGKILLed mid-task is redelivered and
completes once; a job whose worker dies every time ends "failed", never lost.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient

from services.api.app import create_service_app
from services.config import Settings
from services.db.models import Job
from services.queue.app import producer
from services.queue.jobs import BrokerUnavailable, get_job, submit_job
from services.queue.names import TRAINING, probe_task_name

PROBE = probe_task_name("trainer")
STUBBORN = "test.stubborn"  # tests/worker_apps.py
UNFIT_ONCE = "test.unfit_once"
FAILS_UNFIT_ONCE = "test.fails_unfit_once"


def wait_for(job_id: str, statuses: tuple[str, ...], timeout_s: float = 30, poll_s: float = 0.05) -> Job:
    deadline = time.monotonic() + timeout_s
    while (job := get_job(job_id)).status not in statuses:
        if time.monotonic() > deadline:
            pytest.fail(f"job {job_id} still {job.status} (attempts {job.attempts}) after {timeout_s} s")
        time.sleep(poll_s)
    return job


def wait_for_running(job_id: str, attempt: int) -> int:
    """Wait until the given attempt runs; return the pid of the worker child running it."""
    deadline = time.monotonic() + 30
    while True:
        job = get_job(job_id)
        if job.status == "running" and job.attempts == attempt and job.worker:
            return int(job.worker.rsplit(":", 1)[1])
        if time.monotonic() > deadline:
            pytest.fail(f"attempt {attempt} of job {job_id} never ran: {job.status}, attempts {job.attempts}")
        time.sleep(0.02)


def test_probe_round_trip_through_http_worker_and_database(
    platform_env: Callable[..., Settings], start_worker: Callable[..., Any]
) -> None:
    platform_env(auth_enabled=False)
    worker = start_worker("trainer")
    response = TestClient(create_service_app("trainer")).post("/v1/probe", json={"token": "round-trip"})
    assert response.status_code == 202, response.text
    submitted = response.json()
    assert submitted["status"] == "queued" and submitted["queue"] == TRAINING and submitted["kind"] == PROBE

    job = wait_for(submitted["id"], ("succeeded", "failed"))
    assert job.status == "succeeded", job.error
    assert job.attempts == 1
    assert job.result is not None and job.result["token"] == "round-trip"
    assert job.result["pid"] in worker.pool_pids()
    assert job.worker == f"{job.result['host']}:{job.result['pid']}"
    assert job.started_at is not None and job.finished_at is not None and job.finished_at >= job.started_at


def test_resubmission_returns_the_same_job_and_does_the_work_once(
    platform_env: Callable[..., Settings], start_worker: Callable[..., Any]
) -> None:
    worker = start_worker("trainer")
    first = submit_job(PROBE, {"token": "once", "sleep_s": 0.5}, TRAINING)
    again = submit_job(PROBE, {"sleep_s": 0.5, "token": "once"}, TRAINING)  # key order does not matter
    assert again.id == first.id
    other = submit_job(PROBE, {"token": "other"}, TRAINING)
    assert other.id != first.id

    done = wait_for(first.id, ("succeeded", "failed"))
    assert done.status == "succeeded" and done.attempts == 1
    assert submit_job(PROBE, {"token": "once", "sleep_s": 0.5}, TRAINING).status == "succeeded"

    # A duplicate delivery of the same message (the broker's at-least-once) must change nothing.
    producer().send_task(PROBE, args=[first.id], queue=TRAINING, task_id=first.id)
    deadline = time.monotonic() + 30
    while worker.log().count(f"Task {PROBE}[{first.id}] succeeded") < 2:
        assert time.monotonic() < deadline, worker.log()[-3000:]
        time.sleep(0.05)
    after = get_job(first.id)
    assert after.attempts == 1
    assert (after.result, after.finished_at) == (done.result, done.finished_at)
    assert worker.log().count('"event": "job.started"') == 2  # "once" and "other", nothing more
    assert '"reason": "already succeeded"' in worker.log()
    assert redis.Redis.from_url(platform_env().redis_url).llen(TRAINING) == 0


def test_sigkilled_job_is_redelivered_and_completes_once(
    platform_env: Callable[..., Settings], start_worker: Callable[..., Any]
) -> None:
    worker = start_worker("trainer")
    job = submit_job(PROBE, {"token": "killed", "sleep_s": 3}, TRAINING)
    victim = wait_for_running(job.id, attempt=1)
    assert victim in worker.pool_pids() and victim != worker.popen.pid
    os.kill(victim, signal.SIGKILL)

    done = wait_for(job.id, ("succeeded", "failed"))
    assert done.status == "succeeded", done.error
    assert done.attempts == 2
    assert done.result is not None and done.result["token"] == "killed"
    assert done.result["pid"] != victim and done.result["slept_s"] >= 3
    assert worker.popen.poll() is None  # the worker survived the death of its child
    assert worker.log_once_it_has('"event": "job.succeeded"').count('"event": "job.succeeded"') == 1


def test_job_whose_worker_always_dies_is_reported_failed(
    platform_env: Callable[..., Settings], start_worker: Callable[..., Any]
) -> None:
    start_worker("trainer", max_job_attempts=1)
    job = submit_job(PROBE, {"token": "doomed", "sleep_s": 30}, TRAINING)
    os.kill(wait_for_running(job.id, attempt=1), signal.SIGKILL)

    failed = wait_for(job.id, ("succeeded", "failed"))
    assert failed.status == "failed"
    assert failed.attempts == 2 and failed.result is None
    assert failed.error == "gave up after 1 attempts: its worker died each time"
    assert failed.finished_at is not None


@pytest.mark.parametrize("job_kind", [UNFIT_ONCE, FAILS_UNFIT_ONCE], ids=["declared by the job", "found after it failed"])
def test_a_job_whose_process_is_unfit_ends_the_process_and_runs_again_in_a_fresh_one(
    platform_env: Callable[..., Settings], start_worker: Callable[..., Any], job_kind: str
) -> None:
    """An unfit process (a judge that met a lost CUDA context) is not the job's failure: the process exits, as a
    killed one would, and the job's next attempt runs in a new process and stores its result once. Whether the
    job declared it or failed with an ordinary error that the worker's fitness check then explained."""
    worker = start_worker("trainer", app="worker_apps")
    job = submit_job(job_kind, {}, TRAINING)

    done = wait_for(job.id, ("succeeded", "failed"), timeout_s=60)
    assert done.status == "succeeded", done.error
    assert done.attempts == 2 and done.result is not None
    assert done.result["pid"] != done.result["unfit_pid"]  # the unfit process is gone; a fresh one ran it
    assert worker.popen.poll() is None  # the worker's main process replaced its child
    log = worker.log_once_it_has('"event": "job.succeeded"')
    assert log.count('"event": "process.unfit"') == 1 and '"event": "job.failed"' not in log


def test_time_limits_end_a_job_as_failed(platform_env: Callable[..., Settings], start_worker: Callable[..., Any]) -> None:
    """The soft limit interrupts a job; the hard limit kills one that ignores it. Both end failed."""
    start_worker("trainer", app="worker_apps", task_soft_time_limit_s=1, task_hard_time_limit_s=2, visibility_timeout_s=60)
    interrupted = submit_job(PROBE, {"token": "slow", "sleep_s": 30}, TRAINING)
    stubborn = submit_job(STUBBORN, {"seconds": 30}, TRAINING)

    soft = wait_for(interrupted.id, ("succeeded", "failed"))
    assert (soft.status, soft.attempts) == ("failed", 1)
    assert soft.error is not None and soft.error.startswith("SoftTimeLimitExceeded")
    hard = wait_for(stubborn.id, ("succeeded", "failed"))
    assert (hard.status, hard.attempts) == ("failed", 1)
    assert hard.error is not None and hard.error.startswith("TimeLimitExceeded")


def test_a_submission_that_cannot_be_enqueued_is_kept_and_sent_by_the_next_one(
    platform_env: Callable[..., Settings], free_port: Callable[[], int]
) -> None:
    """Redis away: the job is recorded as sent nowhere (the sweeper would send it after the grace); the same
    input submitted once Redis is back sends it at once, and only once."""
    url = platform_env().redis_url
    platform_env(redis_url=f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(BrokerUnavailable, match="Connection refused") as refused:
        submit_job(PROBE, {"token": "orphan"}, TRAINING)
    recorded = get_job(refused.value.job_id)
    assert (recorded.status, recorded.enqueued_at) == ("queued", None)

    platform_env(redis_url=url)  # Redis is back: the same input finds its job and really enqueues it
    job = submit_job(PROBE, {"token": "orphan"}, TRAINING)
    again = submit_job(PROBE, {"token": "orphan"}, TRAINING)
    assert job.id == again.id == recorded.id and job.status == "queued" and job.enqueued_at is not None
    assert redis.Redis.from_url(url).llen(TRAINING) == 1

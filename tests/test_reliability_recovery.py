"""Recovery without waiting for Redis's visibility timeout: the heartbeat on a running job's row, the
sweeper every worker runs (``services.queue.sweeper``), and the claim that keeps two deliveries of one
job from running it at once.

With real workers: a duplicate delivery while the job runs is skipped; the worker's main process
SIGKILLed (its pool child dies with it, the message stays unacknowledged for 40 minutes), the job runs
again on the other worker within seconds; a message Redis lost is sent again once the grace passes. In
this process, on SQLite and PostgreSQL: what the sweeper sends again, what it fails and why, that
sweepers racing send once, that deliveries racing claim once.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from sqlalchemy import select

from services.config import Settings
from services.db import migrate
from services.db.models import Job
from services.db.session import get_engine, session_scope
from services.queue.jobs import _begin_attempt, get_job, submit_job
from services.queue.names import TRAINING, probe_task_name
from services.queue.sweeper import Swept, sweep

PROBE = probe_task_name("trainer")
FAST = {"worker_heartbeat_s": 0.2, "worker_dead_after_s": 1.0, "queued_grace_s": 1.0, "sweep_interval_s": 0.2}


def wait_for(job_id: str, done: Callable[[Job], bool], timeout_s: float = 30) -> Job:
    deadline = time.monotonic() + timeout_s
    while not done(job := get_job(job_id)):
        if time.monotonic() > deadline:
            pytest.fail(f"job {job_id} still {job.status} (attempts {job.attempts}, worker {job.worker}) after {timeout_s} s")
        time.sleep(0.02)
    return job


def queued_ids(url: str, queue: str = TRAINING) -> list[str]:
    return [json.loads(raw)["headers"]["id"] for raw in redis.Redis.from_url(url).lrange(queue, 0, -1)]


def test_a_duplicate_is_skipped_while_the_job_runs_and_a_worker_killed_whole_gives_it_back_in_seconds(
    platform_env: Callable[..., Settings], start_worker: Callable[..., Any], record_property: Callable[[str, object], None]
) -> None:
    """Before: after its worker's main process died, the job stayed "running" until Redis handed its
    message back at the visibility timeout, 2,400 s later."""
    settings = platform_env(**FAST)
    workers = [start_worker("trainer"), start_worker("trainer")]
    job = submit_job(PROBE, {"token": "survivor", "sleep_s": 2}, TRAINING)
    running = wait_for(job.id, lambda j: j.status == "running")
    owner = next(w for w in workers if int(running.worker.rsplit(":", 1)[1]) in w.pool_pids())
    other = next(w for w in workers if w is not owner)

    from services.queue.app import producer

    producer().send_task(PROBE, args=[job.id], queue=TRAINING, task_id=job.id)  # the broker delivers twice
    deadline = time.monotonic() + 10
    while f"running on {running.worker}, which is alive" not in other.log():
        assert time.monotonic() < deadline, other.log()[-3000:]
        time.sleep(0.02)
    assert get_job(job.id).attempts == 1  # the duplicate neither ran nor counted

    os.kill(owner.popen.pid, signal.SIGKILL)  # the main process: no one left to put the message back
    killed = time.monotonic()
    restarted = wait_for(job.id, lambda j: j.attempts == 2 and j.status == "running")
    recovered_s = time.monotonic() - killed
    done = wait_for(job.id, lambda j: j.status in ("succeeded", "failed"))
    assert (done.status, done.attempts) == ("succeeded", 2), done.error
    assert done.result is not None and done.result["pid"] in other.pool_pids() and restarted.worker == done.worker
    assert '"event": "sweeper.sent_again"' in other.log()
    assert sum(w.log().count('"event": "job.started"') for w in workers) == 2
    assert redis.Redis.from_url(settings.redis_url).hlen("unacked") == 1  # the dead worker's message, for 40 minutes
    record_property("recovery_after_main_process_sigkill_s", round(recovered_s, 2))
    print(f"job running again {recovered_s:.2f} s after its worker's main process was SIGKILLed")
    assert recovered_s < 20  # the sweeper's doing: the visibility timeout is 2,400 s


def test_a_job_whose_message_redis_lost_runs_once_its_grace_has_passed(
    platform_env: Callable[..., Settings], start_worker: Callable[..., Any]
) -> None:
    """Before: a job whose message was lost (Redis restarted without its data) stayed "queued" for ever."""
    settings = platform_env(**FAST)
    job = submit_job(PROBE, {"token": "lost"}, TRAINING)
    redis.Redis.from_url(settings.redis_url).delete(TRAINING)
    worker = start_worker("trainer")

    done = wait_for(job.id, lambda j: j.status in ("succeeded", "failed"))
    assert (done.status, done.attempts) == ("succeeded", 2), done.error  # the lost delivery counts
    assert '"why": "the broker lost its message"' in worker.log()
    assert worker.log().count('"event": "job.started"') == 1


# --- the sweeper and the claim, in this process -------------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database(request: pytest.FixtureRequest, platform_env: Callable[..., Settings]) -> Iterator[Callable[..., Settings]]:
    """The platform on SQLite, or on the real PostgreSQL (migrated here, downgraded after)."""
    if request.param == "sqlite":
        yield platform_env
        return
    url = request.getfixturevalue("postgres_url")
    platform_env(database_url=url)
    migrate.upgrade(url)
    try:
        yield platform_env
    finally:
        migrate.downgrade(url)


def running_job(name: str, attempts: int, worker: str, heard: datetime) -> str:
    with session_scope() as session:
        job = Job(
            id=name,
            kind=PROBE,
            queue=TRAINING,
            idempotency_key=name.ljust(64, "-"),
            payload={},
            status="running",
            attempts=attempts,
            worker=worker,
            started_at=heard,
            heartbeat_at=heard,
        )
        session.add(job)
    return name


def test_the_sweeper_sends_again_a_job_whose_worker_went_silent_and_fails_one_past_its_attempts(
    database: Callable[..., Settings],
) -> None:
    settings = database(max_job_attempts=2, **FAST)
    now = datetime.now(UTC)
    silent = running_job("silent", 1, "elsewhere:1", now - timedelta(seconds=5))
    alive = running_job("alive", 1, "elsewhere:2", now - timedelta(seconds=0.5))
    spent = running_job("spent", 2, "elsewhere:3", now - timedelta(seconds=5))

    assert sweep(now) == Swept(sent=[silent], failed=[spent])
    rows = {j.id: j for j in map(get_job, (silent, alive, spent))}
    assert (rows[silent].status, rows[silent].attempts) == ("queued", 1)  # the dead run was counted when it began
    assert (rows[alive].status, rows[alive].attempts) == ("running", 1)
    assert rows[spent].status == "failed" and rows[spent].finished_at is not None
    assert rows[spent].error is not None
    assert rows[spent].error.startswith("gave up after 2 attempts: its worker died each time (the last, elsewhere:3,")
    assert queued_ids(settings.redis_url) == [silent]
    assert sweep(now) == Swept()  # sent once: now it waits in the queue


def test_the_sweeper_sends_again_only_messages_the_broker_lost(database: Callable[..., Settings]) -> None:
    """Waiting in the queue, or taken by a worker a moment ago: held. Gone, or taken longer ago than the
    grace by a worker that never began it: lost, sent again; the last delivery spent: failed."""
    settings = database(max_job_attempts=2, **FAST)
    client = redis.Redis.from_url(settings.redis_url)
    waiting, lost, taken, abandoned, spent = (submit_job(PROBE, {"token": t}, TRAINING).id for t in range(5))
    messages = {json.loads(raw)["headers"]["id"]: raw for raw in client.lrange(TRAINING, 0, -1)}
    for job_id in (lost, taken, abandoned, spent):
        client.lrem(TRAINING, 1, messages[job_id])
    now = datetime.now(UTC)
    for job_id, taken_at in ((taken, now), (abandoned, now - timedelta(seconds=10))):  # kombu's unacknowledged set
        client.hset("unacked", job_id, json.dumps([json.loads(messages[job_id]), "", TRAINING]))
        client.zadd("unacked_index", {job_id: taken_at.timestamp()})
    with session_scope() as session:
        for job in session.scalars(select(Job)):
            job.enqueued_at = now - timedelta(seconds=5)
            job.attempts = 1 if job.id == spent else 0

    swept = sweep(now)
    assert sorted(swept.sent) == sorted([lost, abandoned]) and swept.failed == [spent]
    assert sorted(queued_ids(settings.redis_url)) == sorted([waiting, lost, abandoned])
    assert [get_job(j).attempts for j in (waiting, lost, taken, abandoned)] == [0, 1, 0, 1]
    failed = get_job(spent)
    assert (failed.status, failed.error) == ("failed", "gave up after 2 attempts: the broker lost its message")


def test_racing_sweepers_send_a_job_once(database: Callable[..., Settings]) -> None:
    settings = database(**FAST)
    stale = running_job("stale", 1, "elsewhere:1", datetime.now(UTC) - timedelta(seconds=5))
    start = threading.Barrier(4)
    results: list[Swept] = []

    def race() -> None:
        start.wait()
        results.append(sweep())

    threads = [threading.Thread(target=race) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(len(r.sent) for r in results) == [0, 0, 0, 1]
    assert queued_ids(settings.redis_url) == [stale] and get_job(stale).status == "queued"


def claim(job_id: str, ready: Any, done: Any, results: Any) -> None:
    """One delivery in a process of its own, all at once; each stays alive (an owner) until all have tried."""
    get_engine().dispose(close=False)  # forked: the test's connections stay the test's (as in a pool child)
    ready.wait()
    job, reason = _begin_attempt(job_id)
    results.put((os.getpid(), job is not None, reason))
    done.wait()


def test_racing_deliveries_claim_a_job_once(database: Callable[..., Settings]) -> None:
    database(**FAST)
    job = submit_job(PROBE, {"token": "raced"}, TRAINING)
    context = multiprocessing.get_context("fork")  # as Celery's prefork pool makes its children
    results, ready, done = context.Queue(), context.Barrier(4), context.Barrier(4)
    deliveries = [context.Process(target=claim, args=(job.id, ready, done, results)) for _ in range(4)]
    for process in deliveries:
        process.start()
    outcomes = [results.get(timeout=60) for _ in deliveries]
    for process in deliveries:
        process.join(10)
    winners = [pid for pid, claimed, _ in outcomes if claimed]
    assert len(winners) == 1, outcomes
    claimed = get_job(job.id)
    assert (claimed.status, claimed.attempts, claimed.worker) == ("running", 1, f"{socket.gethostname()}:{winners[0]}")
    assert {reason for _, won, reason in outcomes if not won} == {f"running on {claimed.worker}, which is alive"}


def test_settings_refuse_a_worker_taken_for_dead_within_three_heartbeats() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="KZ_WORKER_DEAD_AFTER_S must be at least three KZ_WORKER_HEARTBEAT_S"):
        Settings(worker_heartbeat_s=5, worker_dead_after_s=10)
    with pytest.raises(ValidationError, match="max_job_attempts"):
        Settings(max_job_attempts=0)

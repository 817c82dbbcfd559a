"""The sweeper: sends again the jobs the queue would not bring back by itself, or fails them with the
reason once their deliveries are spent.

- A job ``running`` whose worker is gone (``services.queue.liveness``: no heartbeat for
  ``worker_dead_after_s``, or on this host a process that no longer exists). Its message waits in
  Redis's unacknowledged set until the visibility timeout (40 minutes) would bring it back.
- A job ``queued`` for ``queued_grace_s`` whose message the broker does not hold: Redis restarted
  without its data, or the sender died between the row and the message. A message a worker took but
  never began (a worker begins what it takes at once) counts as lost once older than the grace too.

A job is sent again under its own id, so everything it writes is keyed as before; a message that
turns out not to be lost after all (Redis gives back an unacknowledged one) reaches a job that is
finished or running on a live owner, and the delivery skips it. Each lost delivery counts as an
attempt (a dead run was counted when it began): past ``max_job_attempts`` the job is failed with the
reason, never lost and never looping.

Every worker runs a sweeper (``start_sweeper``, a thread in each process that runs jobs). What keeps
several from acting twice is the database, not a lock: each change is one ``UPDATE`` conditioned on
the row as this sweeper read it (status, attempts, heartbeat or send time), so of two sweepers, or a
sweeper and a delivery, one wins and only the winner sends. A Redis key (``SET NX`` with the interval
as its expiry) only saves work: one sweep per interval across the workers.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import kombu.exceptions
import redis
import structlog
from sqlalchemy import ColumnElement, func, select, update
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.orm import InstrumentedAttribute, load_only

from services.config import get_settings
from services.db.models import Job
from services.db.session import session_scope
from services.queue.app import producer, redis_client
from services.queue.liveness import owner_alive, worker_name

log = structlog.get_logger(__name__)

SWEEP_KEY = "kernelzero:sweeper"
STORE_AWAY = (redis.RedisError, kombu.exceptions.OperationalError, OperationalError, InterfaceError)


@dataclass
class Swept:
    """Job ids this sweep sent again, and those it failed (their deliveries spent)."""

    sent: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def sweep(now: datetime | None = None) -> Swept:
    settings = get_settings()
    now = now or datetime.now(UTC)
    # What the decisions need, not the payloads (a scoring group's can be megabytes).
    jobs = select(Job).options(
        load_only(Job.kind, Job.queue, Job.status, Job.attempts, Job.worker, Job.heartbeat_at, Job.started_at, Job.enqueued_at)
    )
    sent_since = func.coalesce(Job.enqueued_at, Job.created_at)
    with session_scope() as session:
        running = session.scalars(jobs.where(Job.status == "running")).all()
        waiting = session.scalars(
            jobs.where(Job.status == "queued", sent_since < now - timedelta(seconds=settings.queued_grace_s))
        ).all()
    swept = Swept()
    for job in running:
        last_heard = job.heartbeat_at or job.started_at
        if not owner_alive(job.worker, job.id, job.attempts, last_heard, now, settings.worker_dead_after_s):
            _send_again(job, now, f"its worker died each time (the last, {job.worker}, not heard from since {last_heard})", swept)
    if waiting:
        held = messages_held({job.queue for job in waiting}, now - timedelta(seconds=settings.queued_grace_s))
        for job in waiting:
            if job.id not in held:
                _send_again(job, now, "the broker lost its message", swept)
    if swept.sent or swept.failed:
        log.info("sweeper.swept", sent=swept.sent, failed=swept.failed)
    return swept


def _send_again(job: Job, now: datetime, why: str, swept: Swept) -> None:
    """Send the job again, or fail it where this delivery would pass the limit; only if its row is
    still as read (another sweeper, a delivery or the owner's heartbeat did not change it meanwhile)."""
    settings = get_settings()
    spent = job.attempts + (1 if job.status == "queued" else 0)  # a dead run was counted when it began
    as_read = [
        Job.id == job.id,
        Job.status == job.status,
        Job.attempts == job.attempts,
        _unchanged(Job.heartbeat_at, job.heartbeat_at),
        _unchanged(Job.enqueued_at, job.enqueued_at),
    ]
    if spent >= settings.max_job_attempts:
        values: dict[str, Any] = {"status": "failed", "attempts": spent, "finished_at": now}
        values["error"] = f"gave up after {spent} attempts: {why}"
    else:
        values = {"status": "queued", "attempts": spent, "enqueued_at": now}
    with session_scope() as session:
        changed = session.execute(update(Job).where(*as_read).values(**values).execution_options(synchronize_session=False))
        if changed.rowcount != 1:  # type: ignore[attr-defined]  # an UPDATE's result is a CursorResult
            return
    if values["status"] == "failed":
        log.warning("sweeper.failed_job", job_id=job.id, error=values["error"])
        swept.failed.append(job.id)
        return
    # Sent after the row says queued: should this send fail, the job waits as a lost message does and
    # the next sweep past the grace sends it again.
    producer().send_task(job.kind, args=[job.id], queue=job.queue, task_id=job.id)
    log.info("sweeper.sent_again", job_id=job.id, kind=job.kind, why=why, attempts=spent)
    swept.sent.append(job.id)


def _unchanged(column: InstrumentedAttribute[datetime | None], seen: datetime | None) -> ColumnElement[bool]:
    return column.is_(None) if seen is None else column == seen


def messages_held(queues: Iterable[str], reserved_after: datetime) -> set[str]:
    """Ids of the jobs whose messages wait in ``queues``, or were taken by a worker after
    ``reserved_after``. The names are kombu's Redis transport options (its queue key per priority,
    its unacknowledged hash and index)."""
    held: list[dict[str, Any]] = []
    with producer().connection_for_write() as connection:
        channel: Any = connection.default_channel
        client = channel.client
        for queue in queues:
            for priority in channel.priority_steps:
                key = f"{queue}{channel.sep}{priority}" if priority else queue
                held += [json.loads(raw) for raw in client.lrange(key, 0, -1)]
        recent = set(client.zrange(channel.unacked_index_key, reserved_after.timestamp(), "+inf", byscore=True))
        held += [json.loads(raw)[0] for tag, raw in client.hgetall(channel.unacked_key).items() if tag in recent]
    return {message.get("headers", {}).get("id") for message in held}


def start_sweeper() -> threading.Thread:
    """Sweep every ``sweep_interval_s`` from now on, in a daemon thread of this process."""
    thread = threading.Thread(target=_sweep_forever, name="job-sweeper", daemon=True)
    thread.start()
    return thread


def _sweep_forever() -> None:
    client = redis_client()
    while True:
        time.sleep(sweep_turn(client) / 1000)


def sweep_turn(client: redis.Redis) -> int:
    """Sweep if it is this worker's turn; the milliseconds to wait before the next turn. Never raises, and
    never waits on a Redis that does not answer longer than the client's timeout: the thread must outlive
    any outage and try again."""
    interval_ms = max(1, int(get_settings().sweep_interval_s * 1000))
    try:
        if client.set(SWEEP_KEY, worker_name(), nx=True, px=interval_ms):
            sweep()
        else:  # another worker swept: try again when its turn runs out, so sweeps come every interval
            return min(interval_ms, max(int(client.pttl(SWEEP_KEY)), 0) + 10)
    except STORE_AWAY as exc:  # Redis or the database away: one line per try, not a traceback
        log.warning("sweeper.store_unavailable", error=f"{type(exc).__name__}: {exc}".splitlines()[0])
    except Exception:  # a bug: the thread must outlive it and try again
        log.exception("sweeper.sweep_failed")
    return interval_ms

"""Who runs a job, and whether that process is still alive.

A job's owner is the process running its current attempt, ``host:pid`` (``jobs.worker``). While the
attempt runs, a thread of that process writes the time on the job's row (``jobs.heartbeat_at``) every
``worker_heartbeat_s``, and only while the row still names this attempt (its worker and attempt
number): an attempt that was given up on and sent again cannot claim the job back. The owner is alive
while its heartbeat is recent; on its own host, a process that no longer exists is dead at once (a
pool child that was killed: its job is delivered again within a second); in its own process, the
attempt must be one this process runs now (a threads pool runs several jobs, and a pid can come back).
A process holds a job (``hold``) before it claims it, so two deliveries of one job to the threads of
one process never both go on to claim it.

The times are the workers' clocks: hosts must agree within a few seconds (NTP), far below
``worker_dead_after_s``.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import psutil
import structlog
from sqlalchemy import update
from sqlalchemy.exc import SQLAlchemyError

from services.db.models import Job
from services.db.session import session_scope
from services.schemas.times import as_utc

log = structlog.get_logger(__name__)

_held: dict[str, int | None] = {}  # the jobs this process is claiming (None) or running (the attempt)
_held_lock = threading.Lock()


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def hold(job_id: str) -> bool:
    """Take the job for this process (False: another delivery of it is claimed or run here already)."""
    with _held_lock:
        if job_id in _held:
            return False
        _held[job_id] = None
        return True


def release(job_id: str) -> None:
    with _held_lock:
        _held.pop(job_id, None)


def owner_alive(
    worker: str | None, job_id: str, attempt: int, heartbeat_at: datetime | None, now: datetime, dead_after_s: float
) -> bool:
    """Whether ``worker`` still runs ``attempt`` of the job, as far as its row and this host can tell."""
    if worker is None or heartbeat_at is None or now - as_utc(heartbeat_at) > timedelta(seconds=dead_after_s):
        return False
    host, _, pid = worker.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return True  # another host's process: its heartbeat is all there is to go by
    if int(pid) == os.getpid():
        with _held_lock:
            return _held.get(job_id) == attempt
    try:
        return psutil.Process(int(pid)).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # not ours to inspect: trust the heartbeat
        return True


@contextmanager
def heartbeat(job_id: str, worker: str, attempt: int, interval_s: float) -> Iterator[None]:
    """Beat on the job's row while the body of the ``with`` runs its attempt (a job this process holds)."""
    stop = threading.Event()
    beating = threading.Thread(
        target=_beat, args=(job_id, worker, attempt, interval_s, stop), name=f"heartbeat-{job_id}", daemon=True
    )
    with _held_lock:
        _held[job_id] = attempt
    beating.start()
    try:
        yield
    finally:
        stop.set()
        beating.join()


def _beat(job_id: str, worker: str, attempt: int, interval_s: float, stop: threading.Event) -> None:
    while not stop.wait(interval_s):
        try:
            with session_scope() as session:
                beat = session.execute(
                    update(Job)
                    .where(Job.id == job_id, Job.status == "running", Job.worker == worker, Job.attempts == attempt)
                    .values(heartbeat_at=datetime.now(UTC))
                )
                held = beat.rowcount == 1  # type: ignore[attr-defined]  # an UPDATE's result is a CursorResult
        except SQLAlchemyError as exc:  # the database is away: keep trying, the sweeper cannot act without it either
            log.warning("job.heartbeat_failed", job_id=job_id, error=f"{type(exc).__name__}: {exc}")
            continue
        if not held:
            log.warning("job.heartbeat_lost", job_id=job_id, why="the job was sent again or ended under another attempt")
            return

"""Faults with real processes, as scenarios that ``tests/test_reliability_faults.py`` asserts the outcomes
of and ``benchmarks/recovery.py`` times: Redis killed and started again (with AOF, and with no persistence),
the database's connections cut and refused for a while, the reward API SIGKILLed under a load of
submissions, and a threads-pool reward worker SIGKILLed with several jobs running on its threads.

Each scenario runs on the platform the environment's KZ_ settings describe (the caller sets them up),
starts real reward workers (``fault_apps.reward``: the real job lifecycle, writes and queue, with verdicts
and job times read off the candidates' text), submits scoring jobs, causes its fault while jobs run, ends
it, and waits for every job to end. It returns what happened (``Ended``): every job's final row, the
worker logs, and the seconds from the fault's end to the first job finishing after it and to the last.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from sqlalchemy import create_engine, func, select
from sqlalchemy.engine import make_url

from processes import WorkerProcess, wait_for
from reward_cases import RELU_REFERENCE
from servers import RedisServer, ServiceProcess
from services.config import get_settings
from services.db.models import Job, Score
from services.db.session import session_scope
from services.schemas.jobs import FINISHED
from services.schemas.reward import GroupScoreRequest
from services.schemas.times import as_utc

StartWorker = Callable[..., WorkerProcess]
SUBMIT_FAULT_POINT = "submit.after_record"
# Recovery in a test's time, in the proportions the settings demand (dead after three heartbeats).
FAST_RECOVERY = {"worker_heartbeat_s": 0.2, "worker_dead_after_s": 1.0, "queued_grace_s": 2.0, "sweep_interval_s": 0.2}


@dataclass
class Ended:
    """How the scenario's jobs ended, and when (seconds after the fault ended)."""

    jobs: dict[str, Job]
    logs: list[str]
    first_done_s: float
    all_done_s: float
    notes: dict[str, Any] = field(default_factory=dict)

    def figures(self) -> dict[str, Any]:
        return {"first_job_done_s": round(self.first_done_s, 2), "all_jobs_done_s": round(self.all_done_s, 2), **self.notes}


def group(tag: str, seconds: float) -> GroupScoreRequest:
    """A one-candidate scoring group that ``fault_apps.reward`` finds correct after ``seconds``."""
    return GroupScoreRequest(reference=RELU_REFERENCE, candidates=[f"# correct {tag}, takes {seconds} s"], wait_s=0)


def submit_groups(count: int, seconds: float, tag: str) -> list[str]:
    from reward_svc.service import submit_group

    return [submit_group(group(f"{tag}-{i}", seconds)).id for i in range(count)]


def unfinished(job_ids: list[str]) -> list[Job]:
    with session_scope() as session:
        return list(session.scalars(select(Job).where(Job.id.in_(job_ids), Job.status.not_in(FINISHED))))


def wait_until_ended(job_ids: list[str], fault_ended: float, workers: list[WorkerProcess], timeout_s: float) -> Ended:
    """Until every job ended; ``fault_ended`` is a ``time.time()``. Raises TimeoutError naming the stuck ones."""
    deadline = time.monotonic() + timeout_s
    while stuck := unfinished(job_ids):
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{len(stuck)} of {len(job_ids)} jobs not ended: " + ", ".join(f"{j.id} {j.status}" for j in stuck)
            )
        time.sleep(0.1)
    with session_scope() as session:
        jobs = {job.id: job for job in session.scalars(select(Job).where(Job.id.in_(job_ids)))}
    ends = sorted(as_utc(j.finished_at).timestamp() for j in jobs.values() if j.finished_at is not None)
    after = [t - fault_ended for t in ends if t > fault_ended] or [0.0]
    succeeded = {job.id for job in jobs.values() if job.status == "succeeded"}
    return Ended(jobs, logs_once_they_show(workers, succeeded), after[0], after[-1])


def logs_once_they_show(workers: list[WorkerProcess], succeeded: set[str], timeout_s: float = 10) -> list[str]:
    """The workers' logs once each succeeded job's "job.succeeded" line is in them (a worker writes it just
    after the job's row says so); as they are after ``timeout_s`` otherwise, for ``ended_once`` to report."""
    deadline = time.monotonic() + timeout_s
    while True:
        logs = [w.log() for w in workers]
        if succeeded <= {event["job_id"] for event in events(logs, "job.succeeded")} or time.monotonic() > deadline:
            return logs
        time.sleep(0.1)


def events(logs: list[str], name: str) -> list[dict[str, Any]]:
    """The JSON log lines of event ``name`` in the workers' logs."""
    found = []
    for log in logs:
        for line in log.splitlines():
            if f'"event": "{name}"' in line:
                found.append(json.loads(line[line.index("{") :]))
    return found


def ended_once(ended: Ended) -> list[str]:
    """What breaks "every job ends exactly once with a result or a recorded error": a job not succeeded
    or failed, a failure without its reason, a job that succeeded in more than one attempt's log line, or a
    job whose rows are not one score per candidate."""
    problems = []
    succeeded = Counter(event["job_id"] for event in events(ended.logs, "job.succeeded"))
    with session_scope() as session:
        counted = select(Score.job_id, func.count()).where(Score.job_id.in_(ended.jobs)).group_by(Score.job_id)
        scores: dict[str, int] = {job_id: n for job_id, n in session.execute(counted) if job_id}
    for job in ended.jobs.values():
        if job.status == "failed" and not job.error:
            problems.append(f"{job.id} failed with no reason")
        elif job.status == "succeeded":
            if succeeded[job.id] != 1:
                problems.append(f"{job.id} succeeded {succeeded[job.id]} times in the workers' logs")
            if scores.get(job.id, 0) != len(job.payload["candidates"]):
                problems.append(f"{job.id}: {scores.get(job.id, 0)} scores for {len(job.payload['candidates'])} candidates")
        elif job.status not in FINISHED:
            problems.append(f"{job.id} still {job.status}")
    return problems


def running_count(job_ids: list[str]) -> int:
    with session_scope() as session:
        return int(session.scalar(select(func.count()).where(Job.id.in_(job_ids), Job.status == "running")) or 0)


def succeeded_count(job_ids: list[str]) -> int:
    with session_scope() as session:
        return int(session.scalar(select(func.count()).where(Job.id.in_(job_ids), Job.status == "succeeded")) or 0)


# --- Redis killed, started again after a while -------------------------------------------------


def redis_restart(
    server: RedisServer,
    start_worker: StartWorker,
    *,
    jobs: int = 16,
    job_s: float = 0.4,
    outage_s: float = 3.0,
    during_outage: Callable[[], list[str]] = list,
    timeout_s: float = 120,
) -> Ended:
    """Two reward workers score ``jobs`` groups; once some are done, Redis is SIGKILLed (mid-job for
    others), ``during_outage`` runs (it returns ids of jobs it submitted, which must end too), and after
    ``outage_s`` Redis starts again on its port: with AOF it has its queues back, without them the
    sweeper must send the lost messages again."""
    workers = [start_worker("reward", app="fault_apps.reward"), start_worker("reward", app="fault_apps.reward")]
    job_ids = submit_groups(jobs, job_s, f"redis-{server.appendonly}-{time.time_ns()}")
    wait_for(lambda: succeeded_count(job_ids) >= 2, 60, "two jobs done before the fault")
    server.kill()
    job_ids += during_outage()
    time.sleep(outage_s)
    server.start()
    fault_ended = time.time()
    ended = wait_until_ended(job_ids, fault_ended, workers, timeout_s)
    ended.notes["sent_again_by_the_sweeper"] = len(events(ended.logs, "sweeper.sent_again"))
    return ended


# --- the database's connections cut ------------------------------------------------------------


def postgres_outage(
    database_url: str,
    start_worker: StartWorker,
    *,
    jobs: int = 12,
    job_s: float = 0.4,
    outage_s: float = 3.0,
    during_outage: Callable[[], None] = lambda: None,
    timeout_s: float = 120,
) -> Ended:
    """Two reward workers score ``jobs`` groups on the PostgreSQL database ``database_url``; once some
    are done, the database refuses new connections and every connection to it is terminated
    (``pg_terminate_backend``) while jobs run, ``during_outage`` runs, and after ``outage_s`` it takes
    connections again."""
    workers = [start_worker("reward", app="fault_apps.reward"), start_worker("reward", app="fault_apps.reward")]
    job_ids = submit_groups(jobs, job_s, f"postgres-{time.time_ns()}")
    wait_for(lambda: succeeded_count(job_ids) >= 2, 60, "two jobs done before the fault")
    name = make_url(database_url).database
    admin = create_engine(make_url(database_url).set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
            cut = conn.exec_driver_sql(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            ).scalar_one()
        during_outage()
        time.sleep(outage_s)
    finally:  # whatever failed meanwhile, the database takes connections again
        with admin.connect() as conn:
            conn.exec_driver_sql(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        admin.dispose()
    fault_ended = time.time()
    ended = wait_until_ended(job_ids, fault_ended, workers, timeout_s)
    ended.notes["connections_terminated"] = cut
    return ended


# --- the reward API SIGKILLed under load ----------------------------------------------------------


@dataclass
class Submissions:
    """What the load's clients saw: the job of each 2xx, and connection failures (the clients' to retry)."""

    accepted: dict[str, str] = field(default_factory=dict)  # the group's tag -> its job id
    connection_failures: int = 0
    other_answers: Counter[int] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    stop: threading.Event = field(default_factory=threading.Event, repr=False)  # the scenario gave up


def submit_until_accepted(client: httpx.Client, tag: str, job_s: float, seen: Submissions, give_up_at: float) -> None:
    """One group, sent again (it is idempotent) after a connection failure, as a client should."""
    body = group(tag, job_s).model_dump(mode="json")
    while time.monotonic() < give_up_at and not seen.stop.is_set():
        try:
            answer = client.post("/v1/score/group", json=body)
        except httpx.TransportError:
            with seen.lock:
                seen.connection_failures += 1
            time.sleep(0.2)
            continue
        with seen.lock:
            if answer.is_success:
                seen.accepted[tag] = answer.json()["job_id"]
                return
            seen.other_answers[answer.status_code] += 1
        time.sleep(0.2)


def api_killed_under_load(
    api: ServiceProcess,
    start_worker: StartWorker,
    *,
    clients: int = 4,
    per_client: int = 10,
    job_s: float = 0.1,
    down_s: float = 1.0,
    timeout_s: float = 120,
) -> Ended:
    """``clients`` threads each submit ``per_client`` distinct groups to the reward API one after another;
        after a quarter of them were accepted the API process is SIGKILLed in the middle of a submission, and
        ``down_s`` later started again (as ``kernelzero up`` would). The kill is the fault point
        ``submit.after_record``, armed then: it lands in the worst window, the job recorded and its message not
        sent, where a kill from outside lands only by chance. Notes: the submissions accepted, the connection
        failures, the jobs the API recorded but never sent (``api.log_path`` must be set: the jobs accepted whose
    sending it did not log), and the seconds from the kill to the API accepting again."""
    workers = [start_worker("reward", app="fault_apps.reward")]
    marker = get_settings().data_dir / "faults" / SUBMIT_FAULT_POINT
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()  # a fault point fires once per data dir, when its marker is not there yet: disarmed
    api.start(KZ_FAULT_POINT=SUBMIT_FAULT_POINT)
    seen = Submissions()
    give_up_at = time.monotonic() + timeout_s
    prefix = f"api-{time.time_ns()}"

    def client_loop(index: int) -> None:
        with httpx.Client(base_url=api.url, timeout=30) as client:
            for i in range(per_client):
                submit_until_accepted(client, f"{prefix}-{index}-{i}", job_s, seen, give_up_at)

    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(clients)]
    try:
        for thread in threads:
            thread.start()
        wait_for(lambda: len(seen.accepted) >= clients * per_client // 4, 60, "a quarter of the submissions accepted")
        marker.unlink()  # armed: the next submission's API process SIGKILLs itself between its row and its message
        assert api.popen is not None
        died_with = api.popen.wait(timeout=60)
        killed, accepted_before = time.monotonic(), len(seen.accepted)
        time.sleep(down_s)
        api.start(KZ_FAULT_POINT=SUBMIT_FAULT_POINT)  # fired: the marker is back
        fault_ended = time.time()
        wait_for(lambda: len(seen.accepted) > accepted_before, 60, "a submission accepted after the restart")
        serving_again_s = time.monotonic() - killed
        for thread in threads:
            thread.join()
    finally:  # however the scenario ends, its clients and its API process end with it
        seen.stop.set()
        api.stop()
    ended = wait_until_ended(list(seen.accepted.values()), fault_ended, workers, timeout_s)
    ended.notes.update(
        recorded_not_sent=marker.read_text(),  # the fault point leaves the job it interrupted in its marker
        submissions=clients * per_client,
        accepted=len(seen.accepted),
        connection_failures=seen.connection_failures,
        other_answers=dict(seen.other_answers),
        serving_again_after_kill_s=round(serving_again_s, 2),
        api_exit_code=died_with,
    )
    return ended


# --- a threads-pool reward worker SIGKILLed -------------------------------------------------------


def threads_worker_killed(
    start_worker: StartWorker, *, concurrency: int = 4, jobs: int = 6, job_s: float = 3.0, timeout_s: float = 120
) -> Ended:
    """A GPU reward worker (Celery's threads pool, ``concurrency`` threads: ``KZ_GPU_DEVICES`` must name a
    device) runs ``concurrency`` of ``jobs`` groups at once; its process is SIGKILLed with all of them
    running, and a new worker is started on the queue (what ``kernelzero up`` does after a death). Notes:
    the jobs running when it died."""
    killed_worker = start_worker("reward", app="fault_apps.reward", reward_gpu_concurrency=concurrency)
    job_ids = submit_groups(jobs, job_s, f"threads-{time.time_ns()}")
    wait_for(lambda: running_count(job_ids) >= concurrency, 60, f"{concurrency} jobs running on the threads")
    with session_scope() as session:
        owners = set(session.scalars(select(Job.worker).where(Job.id.in_(job_ids), Job.status == "running")))
    os.kill(killed_worker.popen.pid, signal.SIGKILL)
    killed_worker.popen.wait()
    fault_ended = time.time()
    replacement = start_worker("reward", app="fault_apps.reward", reward_gpu_concurrency=concurrency)
    ended = wait_until_ended(job_ids, fault_ended, [killed_worker, replacement], timeout_s)
    ended.notes.update(running_when_killed=concurrency, owners_when_killed=sorted(o for o in owners if o))
    return ended

"""Faults with real processes (``tests/fault_scenarios.py``): Redis killed and started again, with AOF and
with no persistence; the database's connections cut; the reward API SIGKILLed under a load of
submissions; a threads-pool reward worker SIGKILLed with jobs on its threads. Each asserts that every job
ends exactly once, with its result or a recorded error, and no doubled rows; and, while Redis or the
database is away, that the API answers 503 with the reason and ``Retry-After``, never a 500. The time to
recover is printed and recorded (``record_property``), never asserted: ``benchmarks/recovery.py`` measures it.
"""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import make_url

from fault_scenarios import (
    FAST_RECOVERY,
    Ended,
    api_killed_under_load,
    ended_once,
    events,
    group,
    postgres_outage,
    redis_restart,
    threads_worker_killed,
)
from processes import WorkerProcess
from servers import RedisServer, ServiceProcess
from services.config import Settings
from services.db import migrate
from services.queue.app import redis_client
from services.queue.jobs import idempotency_key, job_id_for
from services.queue.names import SCORE_GROUP_TASK
from services.queue.sweeper import sweep_turn


@pytest.fixture
def private_redis(tmp_path: Path, free_port: Callable[[], int]) -> Iterator[Callable[[bool], RedisServer]]:
    """A ``redis-server`` of the test's own, on a free port, its files in the test's directory."""
    servers: list[RedisServer] = []

    def start(appendonly: bool) -> RedisServer:
        server = RedisServer(free_port(), tmp_path / "redis", appendonly)
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.kill()


def report(ended: Ended, record_property: Callable[[str, object], None], scenario: str) -> None:
    for name, value in ended.figures().items():
        record_property(f"{scenario}.{name}", value)
    print(f"{scenario}: {ended.figures()}")
    assert ended_once(ended) == []


def assert_unavailable(answer: Any, reason: str) -> None:
    """503 with the reason and when to try again, not a 500."""
    assert answer.status_code == 503, answer.text
    assert reason in answer.json()["detail"] and int(answer.headers["retry-after"]) >= 1


@pytest.mark.parametrize("appendonly", [True, False], ids=["aof", "no-persistence"])
def test_redis_killed_and_started_again_every_job_ends_once(
    appendonly: bool,
    private_redis: Callable[[bool], RedisServer],
    platform_env: Callable[..., Settings],
    start_worker: Callable[..., WorkerProcess],
    record_property: Callable[[str, object], None],
) -> None:
    """Without AOF the queued messages die with Redis: the sweeper sends them again after the grace.
    A submission while Redis is away answers 503; its job is recorded and sent once Redis is back."""
    server = private_redis(appendonly)
    platform_env(redis_url=server.url, auth_enabled="false", quota_scored_candidates=0, **FAST_RECOVERY)
    from reward_svc.api import app

    def submit_while_redis_is_away() -> list[str]:
        request = group(f"while-away-{appendonly}", 0.1)
        with TestClient(app) as client:
            assert_unavailable(client.post("/v1/score/group", json=request.model_dump(mode="json")), "Redis")
            assert client.get("/readyz").status_code == 503
        return [job_id_for(idempotency_key(SCORE_GROUP_TASK, request.model_dump(exclude={"wait_s"})))]

    ended = redis_restart(server, start_worker, during_outage=submit_while_redis_is_away)
    report(ended, record_property, f"redis-{'aof' if appendonly else 'noaof'}")
    assert all(job.status == "succeeded" for job in ended.jobs.values()), [j.error for j in ended.jobs.values()]
    if not appendonly:  # what Redis lost came back through the sweeper, not by luck
        assert ended.notes["sent_again_by_the_sweeper"] >= 1


@pytest.mark.postgres
def test_database_connections_cut_every_job_ends_once(
    private_postgres_url: str,
    platform_env: Callable[..., Settings],
    start_worker: Callable[..., WorkerProcess],
    record_property: Callable[[str, object], None],
) -> None:
    """Every connection to the platform's database terminated and new ones refused for seconds, with jobs
    running: their bookkeeping and writes wait for the database instead of failing or leaving jobs
    "running"; a request meanwhile answers 503 (the route's lookup, and the key gate's) instead of a 500."""
    # The sweeper slower than the outage: what brings the jobs through is their own waiting for the database.
    # (Before, a delivery whose claim failed was spent, and a job whose body or end failed stayed "running":
    # only the sweeper brought them back, each at the cost of an attempt.)
    sweeper_too_slow = FAST_RECOVERY | {"worker_heartbeat_s": 0.5, "worker_dead_after_s": 30.0, "queued_grace_s": 30.0}
    platform_env(database_url=private_postgres_url, auth_enabled="false", quota_scored_candidates=0, **sweeper_too_slow)
    migrate.upgrade(private_postgres_url)
    from reward_svc.api import app

    def request_while_the_database_is_away() -> None:
        request = group("while-away", 0.1).model_dump(mode="json")
        with TestClient(app) as client:
            assert_unavailable(client.post("/v1/score/group", json=request), "the database does not answer")
            assert_unavailable(client.get("/v1/jobs/some-job"), "the database does not answer")
        platform_env(auth_enabled="true")  # the key gate looks the key up before any route runs
        with TestClient(app) as client:
            answer = client.get("/v1/jobs/some-job", headers={"Authorization": "Bearer kz_not-checked-yet"})
            assert_unavailable(answer, "the database does not answer")
            assert str(make_url(private_postgres_url).database) not in answer.text  # no internals to a caller without a key

    ended = postgres_outage(private_postgres_url, start_worker, during_outage=request_while_the_database_is_away)
    report(ended, record_property, "postgres")
    assert ended.notes["connections_terminated"] >= 2  # the workers' connections at least: the fault hit them
    assert all(job.status == "succeeded" for job in ended.jobs.values()), [j.error for j in ended.jobs.values()]
    assert [job.attempts for job in ended.jobs.values()] == [1] * len(ended.jobs)  # no delivery spent on the outage
    assert events(ended.logs, "database.away")  # the workers did meet it


def test_the_reward_api_killed_under_load_every_accepted_submission_ends_once(
    platform_env: Callable[..., Settings],
    start_worker: Callable[..., WorkerProcess],
    free_port: Callable[[], int],
    record_property: Callable[[str, object], None],
    tmp_path: Path,
) -> None:
    """Four clients submit 40 groups while the API process is SIGKILLed and started again: every
    submission answered 2xx has a job that ends once; a connection cut is the client's to send again
    (the submission is idempotent), and one the dead API recorded but never sent is the sweeper's."""
    port = free_port()
    platform_env(auth_enabled="false", quota_scored_candidates=0, reward_port=port, **FAST_RECOVERY)
    ended = api_killed_under_load(ServiceProcess("reward_svc.api:app", port, tmp_path / "reward-api.log"), start_worker)
    report(ended, record_property, "api-kill")
    assert ended.notes["api_exit_code"] == -signal.SIGKILL
    assert ended.notes["accepted"] == ended.notes["submissions"]  # each client got through in the end
    assert ended.notes["other_answers"] == {}  # no 5xx, before or after the kill
    assert all(job.status == "succeeded" for job in ended.jobs.values()), [j.error for j in ended.jobs.values()]
    # The job the API recorded as it died had no message: its client, sent again, was answered with it, and the
    # sweeper sent it once its grace passed. (Other jobs may have been sent again too: the sweeper takes a message
    # a worker holds unstarted past the grace for lost, which a busy machine can make happen; they end once all the same.)
    orphan = ended.jobs[ended.notes["recorded_not_sent"]]  # a job some client was answered with
    assert (orphan.id, "the broker lost its message") in {
        (e["job_id"], e["why"]) for e in events(ended.logs, "sweeper.sent_again")
    }


def test_a_threads_pool_worker_killed_with_jobs_on_its_threads_gives_each_back_once(
    platform_env: Callable[..., Settings],
    start_worker: Callable[..., WorkerProcess],
    record_property: Callable[[str, object], None],
) -> None:
    """A GPU reward worker runs several groups on its threads in one process: SIGKILLed, every job
    running on it comes back (same host: its process is gone) and runs once on its replacement."""
    platform_env(gpu_devices="[0]", **FAST_RECOVERY)  # a GPU scoring queue: the threads pool, as on a GPU host
    ended = threads_worker_killed(start_worker)
    report(ended, record_property, "threads-kill")
    assert len(ended.notes["owners_when_killed"]) == 1  # all of them on the threads of the one process
    killed = [job for job in ended.jobs.values() if job.attempts == 2]
    assert len(killed) == ended.notes["running_when_killed"], [(j.id, j.attempts) for j in ended.jobs.values()]
    assert all(job.status == "succeeded" for job in ended.jobs.values()), [j.error for j in ended.jobs.values()]


def test_a_redis_that_takes_connections_and_never_answers_costs_a_timeout_not_a_hang(
    kz_env: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Redis host gone silent (a network cut: no refusal, no answer) must not hang the sweeper's thread,
    and with it every recovery, nor an API request: each gives up after the client's timeout. (redis-py 8
    has a timeout of its own, 5 s, so this passes without ``redis_client``'s too; with redis-py 5.x, which
    pyproject.toml allows and whose default is none, ``redis_client``'s are what bound it.)"""
    import services.queue.app
    from reward_svc.api import app

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # the kernel completes the handshakes; nothing ever reads or answers
        kz_env(auth_enabled="false", redis_url=f"redis://127.0.0.1:{silent.getsockname()[1]}/0", sweep_interval_s=3)
        monkeypatch.setattr(services.queue.app, "REDIS_TIMEOUT_S", 0.5)
        outcomes: dict[str, object] = {}

        def meet_the_silence() -> None:
            outcomes["next sweep in ms"] = sweep_turn(redis_client())
            with TestClient(app) as client:
                outcomes["answer"] = client.post("/v1/score/group", json=group("silent", 0).model_dump(mode="json"))

        meeting = threading.Thread(target=meet_the_silence, daemon=True)
        meeting.start()
        meeting.join(60)
        assert not meeting.is_alive(), "still waiting on a Redis that never answers"
    assert outcomes["next sweep in ms"] == 3000  # the turn gave up; the thread sweeps again next interval
    assert_unavailable(outcomes["answer"], "the quota store (Redis) does not answer (TimeoutError)")

"""Time to recover: from a worker's main process SIGKILLed mid-job (its pool child dies with it, its
message stays unacknowledged in Redis for the visibility timeout, 2,400 s) to the job running again on
another worker, and from a message Redis lost to the job running.

Two trainer workers built as ``kernelzero up`` builds them run a probe job; the one running it is
killed whole. Scenarios:

- ``same-host``: the survivor's sweeper finds the owner's process gone on its own host.
- ``other-host``: the owner runs under another host name (its own UTS namespace, ``unshare -u``:
  root), so only its silent heartbeat tells (``KZ_WORKER_DEAD_AFTER_S``).
- ``lost-message``: the queue's Redis list is deleted after the job was sent; one worker runs.

The recovery settings are the defaults unless given in the environment (``KZ_WORKER_HEARTBEAT_S``,
``KZ_WORKER_DEAD_AFTER_S``, ``KZ_QUEUED_GRACE_S``, ``KZ_SWEEP_INTERVAL_S``).

Faults with real processes (``--scenario``, the scenarios of ``tests/fault_scenarios.py``, which
``tests/test_reliability_faults.py`` asserts the outcomes of): reward workers of ``tests/fault_apps`` score
one-candidate groups while

- ``redis-aof`` / ``redis-noaof``: a private ``redis-server`` (AOF synced on every write, or no persistence)
  is SIGKILLed and started again on its port 3 s later;
- ``postgres``: the platform's PostgreSQL database (a throwaway one) refuses connections and has every
  connection terminated, for 3 s;
- ``api-kill``: the reward API process SIGKILLs itself between a submission's row and its message while 4
  clients submit 40 groups, and is started again 1 s later;
- ``threads-kill``: a GPU reward worker (Celery's threads pool, 4 threads) is SIGKILLed with 4 jobs on its
  threads, and a new one started.

For these it reports the seconds from the fault's end (Redis or the database back, the API or the worker
started again) to the first job finishing after it and to the last, and whether every job ended once. Each
gets a private ``redis-server``; ``postgres`` a database created through ``--postgres`` and dropped after.

Usage: .venv/bin/python benchmarks/recovery.py [--redis redis://127.0.0.1:6379/7] [--repeat 3]
       .venv/bin/python benchmarks/recovery.py --scenario redis-aof,redis-noaof,postgres,api-kill,threads-kill
The first writes benchmarks/results/recovery_cpu.json, and empties the Redis database it is given, which
must be empty at the start; the second benchmarks/results/recovery_faults_cpu.json and .md. Both use a
throwaway data dir (SQLite, but for ``postgres``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "recovery_cpu.json"
FAULT_RESULTS = RESULTS.with_name("recovery_faults_cpu.json")
TESTS = Path(__file__).resolve().parents[1] / "tests"
WAIT_S = 600  # for every job to end: the default grace alone is 60 s
FAULTS = ("redis-aof", "redis-noaof", "postgres", "api-kill", "threads-kill")
RECOVERY_SETTINGS = ("worker_heartbeat_s", "worker_dead_after_s", "queued_grace_s", "sweep_interval_s", "database_retry_s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/7", help="a Redis database this run may empty")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--scenarios", default="same-host,other-host,lost-message")
    parser.add_argument("--scenario", help=f"faults with real processes instead, comma-separated: {', '.join(FAULTS)}")
    parser.add_argument(
        "--postgres", default="postgresql+psycopg://postgres@127.0.0.1:5432/test", help="a superuser's URL (for postgres)"
    )
    args = parser.parse_args()
    if args.scenario:
        faults(args.scenario.split(","), args.repeat, args.postgres)
        return
    import redis

    if redis.Redis.from_url(args.redis).dbsize():
        sys.exit(f"{args.redis} holds keys: give this run an empty Redis database (it empties it between scenarios)")

    data_dir = Path(tempfile.mkdtemp(prefix="kz-recovery-"))
    os.environ.update(KZ_DATA_DIR=str(data_dir), KZ_REDIS_URL=args.redis, KZ_LOG_JSON="true")
    from services.config import get_settings
    from services.db import migrate

    migrate.upgrade()
    settings = get_settings()
    figures: dict[str, list[float]] = {}
    for scenario in args.scenarios.split(","):
        figures[scenario] = [round(run(scenario, data_dir, args.redis), 2) for _ in range(args.repeat)]
        print(f"{scenario}: {figures[scenario]} s", flush=True)
    redis.Redis.from_url(args.redis).flushdb()  # as it was found
    out = {
        "what": "seconds from the fault to the job's next attempt running (see benchmarks/recovery.py)",
        **provenance(),
        "settings": {k: getattr(settings, k) for k in RECOVERY_SETTINGS[:4]},
        "seconds": figures,
        "median_s": {k: statistics.median(v) for k, v in figures.items()},
    }
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {RESULTS}")


def provenance() -> dict[str, str]:
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True).stdout.strip(),
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs, {platform.platform()})",
    }


def faults(scenarios: list[str], repeat: int, postgres_admin_url: str) -> None:
    """Each fault scenario ``repeat`` times; its figures and whether every job ended once."""
    unknown = set(scenarios) - set(FAULTS)
    if unknown:
        sys.exit(f"unknown scenarios {sorted(unknown)}: choose from {', '.join(FAULTS)}")
    sys.path.insert(0, str(TESTS))  # the scenarios are the tests' own: one definition of each fault
    data_dir = Path(tempfile.mkdtemp(prefix="kz-faults-"))
    os.environ.update(KZ_DATA_DIR=str(data_dir), KZ_LOG_JSON="true", KZ_AUTH_ENABLED="false", KZ_QUOTA_SCORED_CANDIDATES="0")
    from processes import reset_platform_caches
    from services.config import get_settings
    from services.db import migrate

    reset_platform_caches()
    migrate.upgrade()
    runs: dict[str, list[dict[str, object]]] = {}
    for scenario in scenarios:
        runs[scenario] = []
        for index in range(repeat):
            figures = fault_run(scenario, data_dir / f"{scenario}-{index}", postgres_admin_url)
            runs[scenario].append(figures)
            print(f"{scenario} #{index + 1}: {figures}", flush=True)
    settings = get_settings()
    out = {
        "what": "seconds from a fault's end to jobs finishing again, and whether every job ended once "
        "(see benchmarks/recovery.py and tests/fault_scenarios.py)",
        **provenance(),
        "settings": {k: getattr(settings, k) for k in RECOVERY_SETTINGS},
        "runs": runs,
        "median_s": {
            scenario: {
                key: statistics.median(float(str(run[key])) for run in figures)
                for key in ("first_job_done_s", "all_jobs_done_s", "serving_again_after_kill_s")
                if key in figures[0]
            }
            for scenario, figures in runs.items()
        },
    }
    FAULT_RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {FAULT_RESULTS}")


def fault_run(scenario: str, run_dir: Path, postgres_admin_url: str) -> dict[str, object]:
    """One run of a fault scenario on a private redis-server (and, for postgres, a throwaway database)."""
    import fault_scenarios
    from processes import WorkerProcess, launch_worker, reset_platform_caches
    from servers import RedisServer, ServiceProcess, created_database, pick_free_port
    from services.db import migrate

    run_dir.mkdir(parents=True)
    workers: list[WorkerProcess] = []

    def start_worker(service: str, app: str | None = None, **fields: object) -> WorkerProcess:
        workers.append(launch_worker(service, run_dir / f"{service}-worker-{len(workers)}.log", app, 60, **fields))
        return workers[-1]

    def configure(**fields: object) -> None:
        os.environ.update({f"KZ_{k.upper()}": str(v) for k, v in fields.items()})
        reset_platform_caches()

    def stop_all(started: list[WorkerProcess]) -> None:
        for worker in started:
            worker.stop()

    def back_to_sqlite() -> None:
        os.environ.pop("KZ_DATABASE_URL", None)
        reset_platform_caches()

    with ExitStack() as cleanup:  # undone last to first: the workers stop before their database is dropped
        server = RedisServer(pick_free_port(), run_dir / "redis", appendonly=scenario == "redis-aof")
        cleanup.callback(server.kill)
        server.start()
        configure(redis_url=server.url, gpu_devices="[]", reward_port=pick_free_port())
        if scenario == "postgres":
            url = cleanup.enter_context(created_database(postgres_admin_url))
            cleanup.callback(back_to_sqlite)
            configure(database_url=url)
            migrate.upgrade(url)
        cleanup.callback(stop_all, workers)
        if scenario.startswith("redis"):
            ended = fault_scenarios.redis_restart(server, start_worker, timeout_s=WAIT_S)
        elif scenario == "postgres":
            ended = fault_scenarios.postgres_outage(url, start_worker, timeout_s=WAIT_S)
        elif scenario == "api-kill":
            api = ServiceProcess("reward_svc.api:app", int(os.environ["KZ_REWARD_PORT"]), run_dir / "reward-api.log")
            cleanup.callback(api.stop)
            ended = fault_scenarios.api_killed_under_load(api, start_worker, timeout_s=WAIT_S)
        else:
            configure(gpu_devices="[0]")  # a GPU scoring queue: the threads pool
            ended = fault_scenarios.threads_worker_killed(start_worker, timeout_s=WAIT_S)
        return {**ended.figures(), "jobs": len(ended.jobs), "not_ended_once": fault_scenarios.ended_once(ended)}


def run(scenario: str, data_dir: Path, redis_url: str) -> float:
    import redis

    from services.queue.jobs import get_job, submit_job
    from services.queue.names import TRAINING, probe_task_name

    redis.Redis.from_url(redis_url).flushdb()
    token = f"{scenario}-{time.time_ns()}"
    if scenario == "lost-message":
        job = submit_job(probe_task_name("trainer"), {"token": token}, TRAINING)
        redis.Redis.from_url(redis_url).delete(TRAINING)
        lost = time.monotonic()
        workers = [start_worker(data_dir, "w1")]
        try:
            wait(lambda: get_job(job.id).status == "succeeded", 600)
            return time.monotonic() - lost
        finally:
            stop(workers)
    owner = start_worker(data_dir, "owner", other_host=scenario == "other-host")
    job = submit_job(probe_task_name("trainer"), {"token": token, "sleep_s": 5}, TRAINING)
    wait(lambda: get_job(job.id).status == "running", 60)
    survivor = start_worker(data_dir, "survivor")
    try:
        os.kill(owner.pid, signal.SIGKILL)
        killed = time.monotonic()
        wait(lambda: get_job(job.id).attempts >= 2 and get_job(job.id).status in ("running", "succeeded"), 600)
        return time.monotonic() - killed
    finally:
        stop([owner, survivor])


def start_worker(data_dir: Path, name: str, other_host: bool = False) -> subprocess.Popen[bytes]:
    from services.cli.launcher import platform_commands
    from services.config import get_settings

    command = next(p.command for p in platform_commands(get_settings(), ("trainer",)) if p.name.endswith("worker"))
    if other_host:
        inner = f"hostname elsewhere-{socket.gethostname()} && exec {shlex.join(command)}"
        command = ["unshare", "--uts", "sh", "-c", inner]
    log_path = data_dir / f"{name}.log"
    with log_path.open("ab") as log:
        worker = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    wait(lambda: " ready." in log_path.read_text(errors="replace"), 60)
    if other_host:  # the worker's main process, not the shell's unshare (exec keeps the pid)
        assert worker.poll() is None, log_path.read_text()[-2000:]
    return worker


def stop(workers: list[subprocess.Popen[bytes]]) -> None:
    for worker in workers:
        try:
            os.killpg(worker.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        worker.wait()


def wait(condition: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            sys.exit(f"timed out after {timeout_s} s")
        time.sleep(0.05)


if __name__ == "__main__":
    main()

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

Usage: .venv/bin/python benchmarks/recovery.py [--redis redis://127.0.0.1:6379/7] [--repeat 3]
Writes benchmarks/results/recovery_cpu.json. Uses a throwaway data dir (SQLite) and empties the Redis
database it is given, which must be empty at the start.
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
from datetime import UTC, datetime
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "recovery_cpu.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/7", help="a Redis database this run may empty")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--scenarios", default="same-host,other-host,lost-message")
    args = parser.parse_args()
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
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True).stdout.strip(),
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs, {platform.platform()})",
        "settings": {
            k: getattr(settings, k) for k in ("worker_heartbeat_s", "worker_dead_after_s", "queued_grace_s", "sweep_interval_s")
        },
        "seconds": figures,
        "median_s": {k: statistics.median(v) for k, v in figures.items()},
    }
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {RESULTS}")


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

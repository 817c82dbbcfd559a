"""Load on the reward API: thousands of scoring submissions from hundreds of concurrent clients, then the
jobs they made scored to the end by a CPU reward worker.

What is measured, in two phases that overlap (the worker starts scoring as soon as the first job is queued):

- **Submission**: ``--requests`` ``POST /v1/score/group`` calls with ``wait_s: 0`` from ``--clients``
  concurrent asyncio clients (httpx, one connection each, over loopback). They carry ``--distinct`` different
  small groups, each sent ``requests / distinct`` times in a shuffled order, as retrying RL pipelines send
  them: the first copy of a group inserts its job and queues it, every later copy finds the job by its
  idempotency key and answers its state. Reported: accepted (2xx) requests per second over the phase, the
  latency of each request (p50, p90, p99, max) and the answers by status code, connection errors by name,
  and the CPU time per request of the API process and of the load generator. Both run on this machine and
  compete for its cores, so the rate is a floor; the API's CPU per request is the figure that carries over.
- **Completion**: each distinct group's job from its creation to its end, as the database recorded both
  (``created_at``, ``finished_at`` from ``GET /v1/jobs/{id}``): p50 and p99, with how many succeeded. One
  CPU worker scores one group at a time, so this is mostly queueing: the n-th job waits for n-1 others.

A sampler reads the scoring queue's length in Redis (``LLEN score.cpu``) four times a second meanwhile; the
queue depth and the jobs finished are plotted over time.

Each group is one tiny Triton ReLU candidate (the Triton interpreter on CPU) with a reference of its own size,
so every distinct group is a real evaluation in the sandbox (reference and candidate children) yet finishes
in seconds. By default the benchmark starts what it measures, as ``kernelzero up`` runs them (the same
commands): the reward API (one uvicorn process) and one CPU reward worker, with a private data dir and its
SQLite database (or ``--database-url``), auth on, and the scoring quota off (a single key sending thousands
of candidates would otherwise meet it: that is the quota working, not the service's capacity). ``--url`` and
``--api-key`` aim it at a running service instead.

Usage:
    .venv/bin/python benchmarks/reward_load.py [--requests 5000] [--clients 200] [--distinct 40]
        [--redis-url redis://127.0.0.1:6379/7] [--database-url URL] [--out benchmarks/results/reward_load_cpu.json]
Writes the JSON and a PNG beside it (same name). The Redis database must hold no other platform's queues.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import matplotlib
import psutil
import redis.asyncio as aioredis
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

matplotlib.use("Agg")  # no display: the plot goes to a file
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "reward_load_cpu.json"
QUEUE = "score.cpu"
console = Console(stderr=True)

REFERENCE = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(4, {width})]


def get_init_inputs():
    return []
"""
CANDIDATE = (ROOT / "tests" / "kernels" / "relu" / "triton_correct.py").read_text()
OPTIONS = {"backend": "triton", "device": "cpu", "trials": 2, "measure_speed": False, "timeout_s": 120}


@dataclass
class Sent:
    """One submission: how long its answer took, and what it was."""

    seconds: float
    status: int | None  # None: no HTTP answer (then ``error`` names why)
    error: str | None = None
    job_id: str | None = None


def groups(distinct: int) -> list[dict[str, Any]]:
    """``distinct`` scoring groups that differ only in the reference's width: each is its own job."""
    return [
        {"reference": REFERENCE.format(width=1024 + 8 * i), "candidates": [CANDIDATE], "options": OPTIONS, "wait_s": 0}
        for i in range(distinct)
    ]


def percentiles(values: list[float], scale: float = 1.0, digits: int = 1) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p90": None, "p99": None, "max": None}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * scale, digits)

    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": round(ordered[-1] * scale, digits)}


async def sample_queue(redis_url: str, start: float, depths: list[tuple[float, int]], stop: asyncio.Event) -> None:
    """(seconds since ``start``, waiting messages) four times a second until ``stop``."""
    client = aioredis.Redis.from_url(redis_url)
    try:
        while not stop.is_set():
            depths.append((round(time.monotonic() - start, 3), int(await client.llen(QUEUE))))
            try:
                await asyncio.wait_for(stop.wait(), 0.25)
            except TimeoutError:
                pass
    finally:
        await client.aclose()


async def submit_all(url: str, key: str, payloads: list[dict[str, Any]], clients: int, progress: Progress) -> list[Sent]:
    """Send every payload, ``clients`` at a time over as many pooled connections."""
    task = progress.add_task("submissions", total=len(payloads))
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for payload in payloads:
        queue.put_nowait(payload)
    sent: list[Sent] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=120) as http:

        async def client() -> None:
            while not queue.empty():
                payload = queue.get_nowait()
                at = time.monotonic()
                try:
                    response = await http.post("/v1/score/group", json=payload)
                    job_id = response.json().get("job_id") if response.is_success else None
                    sent.append(Sent(time.monotonic() - at, response.status_code, job_id=job_id))
                except httpx.HTTPError as exc:
                    sent.append(Sent(time.monotonic() - at, None, error=type(exc).__name__))
                progress.advance(task)

        await asyncio.gather(*(client() for _ in range(clients)))
    return sent


async def await_jobs(url: str, key: str, job_ids: set[str], timeout_s: float, progress: Progress) -> dict[str, dict[str, Any]]:
    """Each job as it ended (or stood when ``timeout_s`` ran out), polled twice a second."""
    task = progress.add_task("jobs scored", total=len(job_ids))
    jobs: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
        while True:
            for job_id in sorted(job_ids - jobs.keys()):
                job = (await http.get(f"/v1/jobs/{job_id}")).raise_for_status().json()
                if job["status"] in ("succeeded", "failed") or time.monotonic() > deadline:
                    jobs[job_id] = job
                    progress.advance(task)
            if len(jobs) == len(job_ids):
                return jobs
            await asyncio.sleep(0.5)


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


async def measure(
    url: str,
    key: str,
    redis_url: str,
    requests: int,
    clients: int,
    distinct: int,
    seed: int,
    timeout_s: float,
    api_pid: int | None = None,
) -> dict[str, Any]:
    payloads = [group for group in groups(distinct) for _ in range(requests // distinct)]
    payloads += groups(distinct)[: requests - len(payloads)]
    random.Random(seed).shuffle(payloads)
    depths: list[tuple[float, int]] = []
    stop = asyncio.Event()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        api_cpu, own_cpu = cpu_seconds(api_pid) if api_pid else 0.0, time.process_time()
        start, wall_start = time.monotonic(), time.time()  # the database's times are wall-clock ones
        sampler = asyncio.create_task(sample_queue(redis_url, start, depths, stop))
        sent = await submit_all(url, key, payloads, clients, progress)
        submit_s = time.monotonic() - start
        api_cpu_s = cpu_seconds(api_pid) - api_cpu if api_pid else None
        own_cpu_s = time.process_time() - own_cpu
        job_ids = {s.job_id for s in sent if s.job_id}
        jobs = await await_jobs(url, key, job_ids, timeout_s, progress)
        stop.set()
        await sampler
    accepted = [s for s in sent if s.status is not None and 200 <= s.status < 300]
    ended = {job_id: datetime.fromisoformat(job["finished_at"]).timestamp() for job_id, job in jobs.items() if job["finished_at"]}
    finished = sorted(t - wall_start for t in ended.values())
    completion = [t - datetime.fromisoformat(jobs[job_id]["created_at"]).timestamp() for job_id, t in ended.items()]
    statuses = Counter(job["status"] for job in jobs.values())
    return {
        "submission": {
            "requests": len(sent),
            "clients": clients,
            "distinct_groups": distinct,
            "seconds": round(submit_s, 2),
            "accepted": len(accepted),
            "accepted_per_s": round(len(accepted) / submit_s, 1),
            "latency_ms": percentiles([s.seconds for s in sent], scale=1e3),
            "status_codes": {str(code): n for code, n in sorted(Counter(s.status for s in sent if s.status).items())},
            "errors": dict(Counter(s.error for s in sent if s.error)),
            "cpu_ms_per_request": {
                "api": None if api_cpu_s is None else round(1e3 * api_cpu_s / len(sent), 2),
                "load_generator": round(1e3 * own_cpu_s / len(sent), 2),
            },
        },
        "completion": {
            "jobs": len(jobs),
            "succeeded": statuses.get("succeeded", 0),
            "failed": statuses.get("failed", 0),
            "unfinished": len(jobs) - len(completion),
            "latency_s": percentiles(completion),
            "last_finished_s": round(finished[-1], 1) if finished else None,
            "jobs_per_minute": round(60 * len(finished) / finished[-1], 1) if finished and finished[-1] > 0 else None,
        },
        "series": {
            "queue_depth": depths,
            "finished_at_s": [round(t, 3) for t in finished],
            "submission_end_s": round(submit_s, 3),
        },
    }


def plot(result: dict[str, Any], path: Path) -> None:
    series = result["series"]
    fig, (depth, done) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    times, depths = zip(*series["queue_depth"], strict=True) if series["queue_depth"] else ((), ())
    depth.step(times, depths, where="post", color="tab:red")
    depth.set_ylabel(f"queue depth (LLEN {QUEUE})")
    finished = series["finished_at_s"]
    done.step([0, *finished], range(len(finished) + 1), where="post", color="tab:green")
    done.set_ylabel("jobs finished")
    done.set_xlabel("seconds since the first submission")
    for axis in (depth, done):
        axis.axvline(series["submission_end_s"], color="grey", linestyle="--", linewidth=1, label="last submission answered")
        axis.grid(alpha=0.3)
    depth.legend(loc="upper right", fontsize=8)
    sub = result["submission"]
    fig.suptitle(
        f"reward API: {sub['requests']} submissions from {sub['clients']} clients ({sub['accepted_per_s']}/s accepted), "
        f"{result['completion']['jobs']} jobs on one CPU worker",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def reward_platform(redis_url: str, database_url: str | None, data_dir: Path) -> Iterator[tuple[str, str, int]]:
    """The reward API and one CPU reward worker as ``kernelzero up`` starts them, on ``data_dir``; yields the
    API's URL, an API key and the API's pid. Their logs are in ``data_dir/logs``."""
    os.environ.update(
        {
            "KZ_DATA_DIR": str(data_dir),
            "KZ_REDIS_URL": redis_url,
            "KZ_REWARD_PORT": str(free_port()),
            "KZ_AUTH_ENABLED": "true",
            "KZ_QUOTA_SCORED_CANDIDATES": "0",
            **({"KZ_DATABASE_URL": database_url} if database_url else {}),
        }
    )
    from services import auth
    from services.cli.launcher import platform_commands
    from services.config import get_settings
    from services.db import migrate

    get_settings.cache_clear()
    settings = get_settings()
    migrate.upgrade()
    _, key = auth.create_api_key("reward-load")
    logs = data_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    processes: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for process in platform_commands(settings, ("reward",)):
            with (logs / f"{process.name}.log").open("wb") as log:
                processes[process.name] = subprocess.Popen(
                    process.command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
        url = settings.service_url("reward")
        deadline = time.monotonic() + 120
        while " ready." not in (logs / "reward-worker.log").read_text(errors="replace") or not _ready(url):
            if time.monotonic() > deadline or any(p.poll() is not None for p in processes.values()):
                raise RuntimeError(f"the reward API or worker did not start: see {logs}")
            time.sleep(0.2)
        yield url, key, processes["reward-api"].pid
    finally:
        for popen in processes.values():  # the whole group: the worker's pool child and its sandboxed children too
            os.killpg(popen.pid, signal.SIGTERM)
        for popen in processes.values():
            try:
                popen.wait(15)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            popen.wait()


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


async def _queue_length(redis_url: str) -> int:
    client = aioredis.Redis.from_url(redis_url)
    try:
        return int(await client.llen(QUEUE))
    finally:
        await client.aclose()


def machine(load_before: tuple[float, float, float]) -> dict[str, Any]:
    """Where it ran; the load averages say how much else ran on the machine meanwhile."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    return {
        "commit": commit or None,
        "hostname": platform.node(),
        "nproc": os.cpu_count(),
        "python": platform.python_version(),
        "load_average_1_5_15": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in os.getloadavg()]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=5000, help="submissions in all")
    parser.add_argument("--clients", type=int, default=200, help="concurrent clients")
    parser.add_argument("--distinct", type=int, default=40, help="distinct groups among them (each one job)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the submission order")
    parser.add_argument(
        "--redis-url", default="redis://127.0.0.1:6379/7", help="Redis database of the queues (no other platform's)"
    )
    parser.add_argument("--database-url", default=None, help="SQLAlchemy URL; default SQLite in a private data dir")
    parser.add_argument("--url", default=None, help="a running reward service instead of starting one (needs --api-key)")
    parser.add_argument("--api-key", default=None, help="key for --url")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds to wait for the jobs after the submissions")
    parser.add_argument("--data-dir", type=Path, default=None, help="data dir of the started service (default: a new temp dir)")
    parser.add_argument("--out", type=Path, default=RESULT, help="the JSON; the plot is written beside it (.png)")
    args = parser.parse_args()
    if not 1 <= args.distinct <= args.requests:
        parser.error("--distinct must be between 1 and --requests")
    if (args.url is None) != (args.api_key is None):
        parser.error("--url and --api-key go together")
    try:
        waiting = asyncio.run(_queue_length(args.redis_url))
    except aioredis.RedisError as exc:
        parser.error(f"no Redis answers at {args.redis_url}: {exc}")
    if waiting:
        parser.error(f"{QUEUE} in {args.redis_url} holds messages already: give the benchmark a Redis database of its own")
    started, load_before = datetime.now(UTC), os.getloadavg()
    if args.url:
        result = asyncio.run(
            measure(args.url, args.api_key, args.redis_url, args.requests, args.clients, args.distinct, args.seed, args.timeout)
        )
        setup = {"service": args.url}
    else:
        data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="kz-reward-load-"))
        with reward_platform(args.redis_url, args.database_url, data_dir) as (url, key, api_pid):
            result = asyncio.run(
                measure(url, key, args.redis_url, args.requests, args.clients, args.distinct, args.seed, args.timeout, api_pid)
            )
        setup = {
            "service": "reward API (1 uvicorn process) and 1 CPU reward worker (celery -c 1), as kernelzero up starts them",
            "database": "sqlite" if args.database_url is None else args.database_url.split("://")[0],
            "auth": "on",
            "scoring_quota": "off",
        }
    report = {
        "benchmark": "reward_load",
        "date": started.isoformat(timespec="seconds"),
        "machine": machine(load_before),
        "setup": {**setup, "group": {"candidates": 1, "options": OPTIONS, "reference": "ReLU of a (4, 1024 + 8 i) tensor"}},
        **result,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    plot(report, args.out.with_suffix(".png"))
    sub, done = report["submission"], report["completion"]
    console.print(
        f"{sub['accepted']}/{sub['requests']} accepted, {sub['accepted_per_s']}/s; submission latency "
        f"p50 {sub['latency_ms']['p50']} ms, p99 {sub['latency_ms']['p99']} ms; status {sub['status_codes']}"
        f"{'; errors ' + str(sub['errors']) if sub['errors'] else ''}"
    )
    console.print(
        f"{done['succeeded']}/{done['jobs']} jobs succeeded; completion p50 {done['latency_s']['p50']} s, "
        f"p99 {done['latency_s']['p99']} s; {done['jobs_per_minute']} jobs/min. Wrote {args.out} and its .png"
    )


if __name__ == "__main__":
    main()

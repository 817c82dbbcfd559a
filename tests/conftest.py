"""Shared fixtures: the real parts, isolated per test.

- ``kz_env``: KZ_ settings pointed at a private data dir, with the cached settings, engines and
  Celery producer reset, because every one of them is an ``lru_cache`` keyed on nothing.
- ``redis_url``: the shared Redis, but a database number this test session alone holds (a lock
  key claims it), so concurrent test runs on one machine, and the pytest-xdist workers of one run
  (each a session of its own), do not eat each other's messages.
- ``postgres_url``: a throwaway database created through ``KZ_TEST_POSTGRES_URL`` and dropped after, one per
  session (per pytest-xdist worker); ``private_postgres_url``: one per test, empty, and the test's own to cut off.
- ``platform_env``: ``kz_env`` + that Redis database (emptied) + a migrated SQLite database.
- ``start_worker``: a real Celery worker process, built exactly as ``kernelzero up`` builds it.

A server that does not answer skips its tests locally; with ``CI`` set it fails them instead, so
CI can never go green by skipping.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn
from urllib.parse import urlparse

import pytest
import redis
import torch
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from coder_svc.template import TemplateGenerator
from processes import WorkerDidNotStart, WorkerProcess, launch_worker, reset_platform_caches
from reward_svc.evaluate import Evaluator
from servers import created_database, pick_free_port, serve
from services.cli.launcher import platform_commands
from services.config import Settings, get_settings
from services.db import migrate

TEST_REDIS_URL = os.environ.get("KZ_TEST_REDIS_URL", "redis://127.0.0.1:6379")
TEST_POSTGRES_URL = os.environ.get("KZ_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REDIS_LOCK_KEY = "kernelzero:test-session"
REDIS_DB_CANDIDATES = range(15, 7, -1)


def share_cores_between_xdist_workers() -> None:
    """Under pytest-xdist, give each worker's torch (OpenMP) its share of the cores, not all of them.

    Two workers each running torch with one thread per core oversubscribe the machine, and OpenMP's
    threads spin while they wait for each other: on 2 busy cores, with two threads per worker,
    test_trainer_learning took 54 to 91 s, and 1 s alone; with one thread per worker it stayed off the
    slowest list (under 24 s). The environment reaches every process a test starts (workers, CLIs, trainers);
    sandboxed children already run with one thread (services/children/pool.py). An OMP_NUM_THREADS
    given by the caller is kept.
    """
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        threads = max(1, (os.cpu_count() or 1) // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)  # this process imported torch above, before the variable was set


share_cores_between_xdist_workers()


def unavailable(reason: str) -> NoReturn:
    """Skip locally; fail under CI, where every server must be up."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so this is a failure, not a skip)")
    pytest.skip(reason)


@pytest.fixture
def kz_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Settings]]:
    """Private settings for one test; call the fixture's value with KZ_ fields to change them.

    Inherited KZ_ settings and a developer's ``.env`` are kept out (the cwd moves to tmp_path).
    """
    for field in Settings.model_fields:
        monkeypatch.delenv(f"KZ_{field.upper()}", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KZ_DATA_DIR", str(tmp_path / "data"))
    reset_platform_caches()

    def configure(**fields: object) -> Settings:
        for field, value in fields.items():
            monkeypatch.setenv(f"KZ_{field.upper()}", str(value))
        reset_platform_caches()
        return get_settings()

    yield configure
    reset_platform_caches()


@pytest.fixture
def free_port() -> Callable[[], int]:
    """Gives TCP ports nothing listens on right now (the kernel picked each, then we let it go)."""
    return pick_free_port


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A Redis database number held by this session alone (``KZ_TEST_REDIS_URL`` with a path pins one)."""
    with claimed_redis_database() as url:
        yield url


@contextmanager
def claimed_redis_database() -> Iterator[str]:
    """Claims a free Redis database number for this session (a lock key in it), empties it when done."""
    base = TEST_REDIS_URL.rstrip("/")
    try:
        redis.Redis.from_url(base, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        unavailable(f"Redis at {base} unreachable: {exc}")
    pinned = urlparse(base).path.strip("/")
    candidates = [base] if pinned else [f"{base}/{db}" for db in REDIS_DB_CANDIDATES]
    token = f"{os.getpid()}:{secrets.token_hex(4)}"
    for url in candidates:
        client = redis.Redis.from_url(url)
        if client.set(REDIS_LOCK_KEY, token, nx=True, ex=3600):
            break
    else:
        pytest.fail(f"every Redis database in {candidates} is held by another test session ({REDIS_LOCK_KEY})")
    yield url
    client.flushdb()


def empty_redis(url: str) -> None:
    """Drop every key but the session lock: no message of an earlier test reaches a new worker."""
    client = redis.Redis.from_url(url)
    for key in client.scan_iter():
        if key != REDIS_LOCK_KEY.encode():
            client.delete(key)


@contextmanager
def throwaway_postgres_database() -> Iterator[str]:
    """A fresh database on the real PostgreSQL (``KZ_TEST_POSTGRES_URL``), dropped after. Only for fixtures:
    pytest ends a fixture without throwing the test's exceptions into it, so an OperationalError here is the
    server's, before or after the test."""
    try:
        with created_database(TEST_POSTGRES_URL) as url:
            yield url
    except OperationalError as exc:
        unavailable(f"PostgreSQL at {make_url(TEST_POSTGRES_URL).render_as_string(hide_password=True)} unreachable: {exc.orig}")


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """The session's database on the real PostgreSQL: shared by the session's tests, so it may hold
    other tests' tables and rows (a test that needs it empty takes ``private_postgres_url``)."""
    with throwaway_postgres_database() as url:
        yield url


@pytest.fixture
def private_postgres_url() -> Iterator[str]:
    """A database of this test's own on the real PostgreSQL: empty whatever ran before it in this process,
    and one the test may cut off (its connections terminated, new ones refused) without touching any other
    test's."""
    with throwaway_postgres_database() as url:
        yield url


@pytest.fixture
def platform_env(kz_env: Callable[..., Settings], redis_url: str) -> Callable[..., Settings]:
    """Settings on the session's Redis database (emptied) and a migrated SQLite database."""
    empty_redis(redis_url)
    kz_env(redis_url=redis_url)
    migrate.upgrade()
    return kz_env


@pytest.fixture
def start_worker(platform_env: Callable[..., Settings], tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start ``<service>.worker`` as ``kernelzero up`` would; extra KZ_ fields go to its environment."""
    workers: list[WorkerProcess] = []

    def start(service: str = "trainer", app: str | None = None, ready_timeout_s: float = 60, **fields: object) -> WorkerProcess:
        """``app`` swaps the service's worker module for one under tests/ (e.g. ``worker_apps``)."""
        try:
            worker = launch_worker(service, tmp_path / f"{service}-worker-{len(workers)}.log", app, ready_timeout_s, **fields)
        except WorkerDidNotStart as exc:
            pytest.fail(str(exc))
        workers.append(worker)
        return worker

    yield start
    with ThreadPoolExecutor(max(1, len(workers))) as stopping:  # each waits out its warm shutdown: side by side
        list(stopping.map(WorkerProcess.stop, workers))


@pytest.fixture(scope="session")
def shared_evaluator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Evaluator]:
    """One reward evaluator for every test that only evaluates groups, on settings of its own: its
    children warm up (torch imported, most of a small evaluation's time) while earlier ones work."""
    instance = Evaluator(
        Settings(data_dir=tmp_path_factory.mktemp("evaluator"), reward_warm_children=2, reward_parallel_children=2)
    )
    yield instance
    instance.close()


@pytest.fixture
def evaluator(shared_evaluator: Evaluator) -> Evaluator:
    return shared_evaluator


@pytest.fixture
def generator(kz_env: Callable[..., Settings]) -> TemplateGenerator:
    """The template generator (its tracer's sandboxed children on the test's settings)."""
    return TemplateGenerator(kz_env())


@pytest.fixture
def coder_api(
    platform_env: Callable[..., Settings],
    start_worker: Callable[..., WorkerProcess],
    free_port: Callable[[], int],
    tmp_path: Path,
) -> Iterator[str]:
    """The coder's URL; the reward service listens at the settings' reward URL (what the clients use).
    The coder worker serves the hf backend from ``tmp_path / "tiny-lm"``: a test that asks for it writes it there."""
    reward_port, coder_port = free_port(), free_port()
    platform_env(auth_enabled="false", reward_warm_children=1, reward_port=reward_port, coder_port=coder_port)
    start_worker("reward")
    start_worker("coder", coder_hf_model_path=tmp_path / "tiny-lm")
    with serve("reward_svc.api:app", reward_port), serve("coder_svc.api:app", coder_port) as url:
        yield url


@pytest.fixture(scope="session")
def reward_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One reward service for the whole session, as ``kernelzero up`` runs it (uvicorn and a CPU Celery
    worker, auth off, SQLite), on a Redis database of its own, so tests that empty theirs never touch its
    queue; its URL. For the integrations' tests, which only score groups over HTTP."""
    data_dir = tmp_path_factory.mktemp("reward-service")
    with claimed_redis_database() as redis_db:
        port = pick_free_port()
        settings = {"data_dir": data_dir, "redis_url": redis_db, "auth_enabled": "false", "reward_port": port}
        settings |= {"reward_warm_children": 1, "log_json": "false"}
        env = {k: v for k, v in os.environ.items() if not k.startswith("KZ_")} | {
            f"KZ_{k.upper()}": str(v) for k, v in settings.items()
        }
        subprocess.run(
            [sys.executable, "-c", "from services.db import migrate; migrate.upgrade()"], env=env, check=True, cwd=data_dir
        )
        commands = platform_commands(Settings(_env_file=None, **settings), ("reward",))  # type: ignore[arg-type]
        started = []
        try:
            for process in commands:
                log = (data_dir / f"{process.name}.log").open("wb")
                started.append(
                    (
                        subprocess.Popen(
                            process.command, env=env, cwd=data_dir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                        ),
                        log,
                    )
                )
            url = f"http://127.0.0.1:{port}"
            wait_for_reward_service(url, data_dir / "reward-worker.log", [p for p, _ in started])
            yield url
        finally:
            for popen, _ in started:
                if popen.poll() is None:
                    os.killpg(popen.pid, signal.SIGTERM)
            for popen, log in started:
                try:
                    popen.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(popen.pid, signal.SIGKILL)
                    popen.wait()
                log.close()


def wait_for_reward_service(url: str, worker_log: Path, processes: list[subprocess.Popen[bytes]], timeout_s: float = 90) -> None:
    """Until the API answers ready and the worker has logged that it is ready."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        if any(p.poll() is not None for p in processes) or time.monotonic() > deadline:
            pytest.fail(f"reward service did not start at {url}:\n{worker_log.read_text(errors='replace')[-3000:]}")
        try:
            api_ready = httpx.get(f"{url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            api_ready = False
        if api_ready and worker_log.exists() and " ready." in worker_log.read_text(errors="replace"):
            return
        time.sleep(0.2)

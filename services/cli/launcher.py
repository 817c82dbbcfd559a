"""``kernelzero up``: run the whole platform on one machine as supervised child processes.

Every child gets its own process group, so stopping one stops what it forked (Celery's pool,
uvicorn's workers). Ctrl-C or SIGTERM stops them all: SIGTERM, a grace period, then SIGKILL.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import httpx
import redis
from rich.console import Console

from services.config import SERVICE_NAMES, Settings
from services.queue.names import service_queues

SERVICE_PACKAGES = {"proposer": "proposer_svc", "coder": "coder_svc", "reward": "reward_svc", "trainer": "trainer"}
COLORS = {"proposer": "cyan", "coder": "magenta", "reward": "green", "trainer": "yellow", "redis": "red"}


@dataclass
class ManagedProcess:
    name: str
    command: list[str]
    popen: subprocess.Popen[bytes] | None = None
    reader: threading.Thread | None = field(default=None, repr=False)

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None


def run_state_path(settings: Settings) -> Path:
    return settings.data_dir / "run" / "up.json"


def redis_answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1).ping())
    except redis.RedisError:
        return False


def platform_commands(settings: Settings, services: tuple[str, ...] = SERVICE_NAMES) -> list[ManagedProcess]:
    """The API server and the Celery worker of each service."""
    processes = []
    for service in services:
        package = SERVICE_PACKAGES[service]
        processes.append(
            ManagedProcess(
                f"{service}-api",
                [
                    sys.executable,
                    "-m",
                    "uvicorn",
                    f"{package}.api:app",
                    "--host",
                    settings.host,
                    "--port",
                    str(settings.service_port(service)),
                    "--no-access-log",
                ],
            )
        )
        queues = ",".join(service_queues(service, settings.gpu_devices))
        processes.append(
            ManagedProcess(
                f"{service}-worker",
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    f"{package}.worker",
                    "worker",
                    "-Q",
                    queues,
                    *worker_pool_args(service, settings),
                    "-n",
                    f"{service}@%h",
                    "--loglevel",
                    "INFO",
                    "--without-gossip",
                    "--without-mingle",
                    "--without-heartbeat",
                ],
            )
        )
    return processes


def worker_pool_args(service: str, settings: Settings) -> list[str]:
    """One process per worker; a GPU reward worker runs several groups in threads that share its
    warm children (Celery's prefork would give each process its own pool and its own CUDA context)."""
    if service == "reward" and settings.gpu_devices:
        return ["--pool", "threads", "-c", str(settings.reward_gpu_concurrency)]
    return ["-c", "1"]


def local_redis_command(settings: Settings) -> ManagedProcess:
    server = shutil.which("redis-server")
    if server is None:
        raise RuntimeError(
            f"no Redis answers at {settings.redis_url} and redis-server is not installed "
            "(apt-get install redis-server, or point KZ_REDIS_URL at a running Redis)"
        )
    port = urlparse(settings.redis_url).port or 6379
    return ManagedProcess(
        "redis",
        [
            server,
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(settings.data_dir),
        ],
    )


class Launcher:
    def __init__(self, settings: Settings, console: Console, services: tuple[str, ...] = SERVICE_NAMES) -> None:
        self.settings = settings
        self.console = console
        self.services = services
        self.processes: list[ManagedProcess] = []
        self._stopping = threading.Event()

    def start(self, env: dict[str, str]) -> None:
        if not redis_answers(self.settings.redis_url):
            self._spawn(local_redis_command(self.settings), env)
            self._wait_for(lambda: redis_answers(self.settings.redis_url), "local Redis", 15)
        for process in platform_commands(self.settings, self.services):
            self._spawn(process, env)
        self._write_state()

    def _spawn(self, process: ManagedProcess, env: dict[str, str]) -> None:
        process.popen = subprocess.Popen(
            process.command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        process.reader = threading.Thread(target=self._stream, args=(process,), daemon=True)
        process.reader.start()
        self.processes.append(process)

    def _stream(self, process: ManagedProcess) -> None:
        assert process.popen is not None and process.popen.stdout is not None
        color = COLORS.get(process.name.split("-")[0], "white")
        for raw in process.popen.stdout:
            line = raw.decode(errors="replace").rstrip()
            self.console.print(f"[{color}]{process.name:>15}[/] | {line}", markup=True, highlight=False, soft_wrap=True)

    def _wait_for(self, predicate: Callable[[], bool], what: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate() or self._stopping.is_set():  # Ctrl-C during start-up stops at once
                return
            self.raise_if_child_died()
            time.sleep(0.25)
        raise TimeoutError(f"{what} did not become ready within {timeout_s:.0f} s")

    def wait_until_ready(self, timeout_s: float = 90) -> None:
        for service in self.services:
            url = f"{self.settings.service_url(service)}/readyz"
            self._wait_for(functools.partial(_answers_200, url), f"{service} service", timeout_s)

    def raise_if_child_died(self) -> None:
        for process in self.processes:
            if process.popen is not None and process.popen.poll() is not None and not self._stopping.is_set():
                raise RuntimeError(f"{process.name} exited with code {process.popen.returncode}")

    def supervise(self) -> None:
        """Block until a signal or a child's death."""
        while not self._stopping.is_set():
            self.raise_if_child_died()
            self._stopping.wait(0.5)

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def request_stop(self) -> None:
        self._stopping.set()

    def stop(self, grace_s: float = 15) -> None:
        self._stopping.set()
        for process in reversed(self.processes):
            _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for process in self.processes:
            assert process.popen is not None
            try:
                process.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for process in self.processes:  # the group may outlive its leader: sweep it
            _signal_group(process, signal.SIGKILL)
            assert process.popen is not None
            process.popen.wait()
        run_state_path(self.settings).unlink(missing_ok=True)

    def _write_state(self) -> None:
        path = run_state_path(self.settings)
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {
            "launcher_pid": os.getpid(),
            "processes": [{"name": p.name, "pid": p.pid} for p in self.processes],
            "services": {s: self.settings.service_url(s) for s in self.services},
        }
        path.write_text(json.dumps(state, indent=2))


def _signal_group(process: ManagedProcess, sig: signal.Signals) -> None:
    if process.popen is None:
        return
    try:
        os.killpg(process.popen.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _answers_200(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False

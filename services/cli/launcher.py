"""``kernelzero up``: run the whole platform on one machine as supervised child processes.

Every child gets its own process group, so stopping one stops what it forked (Celery's pool,
uvicorn's workers). Ctrl-C or SIGTERM stops them all: SIGTERM, a grace period, then SIGKILL.
Once the platform is up, a child that dies is started again after a backoff; its death after
``KZ_RESTART_LIMIT`` restarts within ``KZ_RESTART_WINDOW_S`` is a crash loop, which stops the
platform with the reason. One ``up`` per data dir: a second is refused by a lock on it.
"""

from __future__ import annotations

import errno
import fcntl
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO
from urllib.parse import urlparse

import httpx
import psutil
import redis
from rich.console import Console
from rich.markup import escape

from services.config import SERVICE_NAMES, Settings
from services.queue.names import service_queues

SERVICE_PACKAGES = {"proposer": "proposer_svc", "coder": "coder_svc", "reward": "reward_svc", "trainer": "trainer"}
COLORS = {"proposer": "cyan", "coder": "magenta", "reward": "green", "trainer": "yellow", "redis": "red"}


MAX_BACKOFF_S = 60.0


class AlreadyRunning(RuntimeError):
    """Another ``kernelzero up`` holds this data dir."""


class PortInUse(RuntimeError):
    """A port the platform needs is taken by a process that is not ours."""


class CrashLoop(RuntimeError):
    """A process died more often than the restart limit allows."""


@dataclass
class ManagedProcess:
    name: str
    command: list[str]
    popen: subprocess.Popen[bytes] | None = None
    reader: threading.Thread | None = field(default=None, repr=False)
    restarts: list[float] = field(default_factory=list)  # monotonic times of its restarts within the window
    restart_at: float | None = None  # set while it is dead and waits out its backoff

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None


def run_state_path(settings: Settings) -> Path:
    return settings.data_dir / "run" / "up.json"


def instance_lock_path(settings: Settings) -> Path:
    return settings.data_dir / "run" / "up.lock"


def hold_instance_lock(settings: Settings) -> IO[str]:
    """Take the data dir's ``up`` lock for as long as the returned file stays open (the process's life: the
    kernel drops an flock when its holder dies, however it dies), with this process's pid written in it.
    Two instances on one data dir would share its database, key and state file, and the second would
    answer its readiness check from the first's services."""
    path = instance_lock_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = path.open("a+")  # not "w": that would empty the holder's pid before the lock is ours
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise AlreadyRunning(
            f"kernelzero up already runs on {settings.data_dir} as pid {holder}: stop it first "
            f"(Ctrl-C in its terminal, or kill -INT {holder}), or give this one another KZ_DATA_DIR"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def stop_running_up(settings: Settings, timeout_s: float = 60.0) -> int | None:
    """Send SIGINT to the ``kernelzero up`` holding this data dir's lock (what Ctrl-C in its terminal sends)
    and wait until it let the lock go; its pid, or None when none runs. ``TimeoutError`` if it is still
    there after ``timeout_s``."""
    path = instance_lock_path(settings)
    if not path.exists():
        return None
    with path.open("a+") as probe:
        try:
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            probe.seek(0)
            pid = int(probe.read().strip() or 0)
        else:
            return None  # nobody holds it: nothing runs
    if pid <= 0:
        raise TimeoutError(f"{path} is locked but names no pid; stop that kernelzero up in its terminal")
    os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with path.open("a+") as probe:
            try:
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                time.sleep(0.2)
                continue
            return pid
    raise TimeoutError(f"kernelzero up (pid {pid}) still runs {timeout_s:.0f} s after SIGINT; kill -TERM {pid} stops it harder")


def check_ports_free(settings: Settings, services: tuple[str, ...] = SERVICE_NAMES) -> None:
    """Refuse to start over a port something else listens on: uvicorn would die on it after the start, or,
    worse, the readiness check would be answered by whatever holds it."""
    for service in services:
        port = settings.service_port(service)
        problem = _bind_problem(settings.host, port)
        if problem is not None:
            raise PortInUse(
                f"port {port} on {settings.host}, where the {service} service listens, {problem}: "
                f"stop that process or set KZ_{service.upper()}_PORT to a free port"
            )


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
    problem = _bind_problem("127.0.0.1", port)
    if problem is not None:
        raise PortInUse(
            f"no Redis answers at {settings.redis_url}, and its port {port} {problem}: "
            "point KZ_REDIS_URL at a running Redis, or at a free port for a local one"
        )
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
        self._env: dict[str, str] = {}
        self._stopping = threading.Event()

    def start(self, env: dict[str, str]) -> None:
        self._env = env
        if not redis_answers(self.settings.redis_url):
            self.spawn(local_redis_command(self.settings))
            self._wait_for(lambda: redis_answers(self.settings.redis_url), "local Redis", 15)
        for process in platform_commands(self.settings, self.services):
            self.spawn(process)
        self._write_state()

    def spawn(self, process: ManagedProcess) -> None:
        """Start ``process`` and supervise it from now on."""
        self._start(process)
        self.processes.append(process)

    def _start(self, process: ManagedProcess) -> None:
        process.popen = subprocess.Popen(
            process.command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self._env,
            start_new_session=True,
        )
        process.reader = threading.Thread(target=self._stream, args=(process, process.popen), daemon=True)
        process.reader.start()

    def _stream(self, process: ManagedProcess, popen: subprocess.Popen[bytes]) -> None:
        assert popen.stdout is not None
        color = COLORS.get(process.name.split("-")[0], "white")
        for raw in popen.stdout:
            line = raw.decode(errors="replace").rstrip()
            self.console.print(f"[{color}]{process.name:>15}[/] | {line}", markup=True, highlight=False, soft_wrap=True)

    def _say(self, line: str) -> None:
        self.console.print(f"[bold]{'launcher':>15}[/] | {escape(line)}", markup=True, highlight=False, soft_wrap=True)

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
        """During start-up a death is fatal: a process that cannot start (a broken setting, a missing
        package) would only die again, and the first error says more than a crash loop's."""
        for process in self.processes:
            if process.popen is not None and process.popen.poll() is not None and not self._stopping.is_set():
                raise RuntimeError(f"{process.name} exited during start-up: {_how_it_ended(process.popen.returncode)}")

    def supervise(self, tick_s: float = 0.2) -> None:
        """Block until a signal, starting again each process that dies (after its backoff); raise
        ``CrashLoop`` for one that dies more often than the restart limit allows."""
        while not self._stopping.is_set():
            for process in self.processes:
                self._tend(process, time.monotonic())
            self._stopping.wait(tick_s)

    def _tend(self, process: ManagedProcess, now: float) -> None:
        assert process.popen is not None
        if process.restart_at is None:
            code = process.popen.poll()
            if code is None or self._stopping.is_set():
                return
            _signal_group(process, signal.SIGKILL)  # what it forked (a Celery pool child) must not outlive it
            window, limit = self.settings.restart_window_s, self.settings.restart_limit
            process.restarts = [t for t in process.restarts if now - t < window]
            how = _how_it_ended(code)
            if limit == 0:
                raise CrashLoop(f"{process.name} died ({how}), and KZ_RESTART_LIMIT=0 turns restarts off")
            if len(process.restarts) >= limit:
                raise CrashLoop(
                    f"{process.name} crash loop: it died again ({how}) after {len(process.restarts)} restart(s) within "
                    f"{window:g} s (KZ_RESTART_LIMIT={limit}, KZ_RESTART_WINDOW_S={window:g}); its last lines are above"
                )
            delay = min(MAX_BACKOFF_S, self.settings.restart_backoff_s * 2 ** len(process.restarts))
            self._say(
                f"{process.name} (pid {process.pid}) died: {how}; restarting it in {delay:g} s "
                f"(restart {len(process.restarts) + 1} of {limit} allowed within {window:g} s)"
            )
            process.restart_at = now + delay
        elif now >= process.restart_at and not self._stopping.is_set():
            old = process.pid
            process.restart_at = None
            process.restarts.append(now)
            self._start(process)
            self._write_state()
            self._say(f"{process.name} restarted: pid {old} -> {process.pid}")

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def request_stop(self) -> None:
        self._stopping.set()

    def stop(self, grace_s: float = 15) -> None:
        self._stopping.set()
        # One waiting out its backoff is dead and its group killed already; its old pid may be anyone's now.
        running = [process for process in self.processes if process.restart_at is None]
        for process in reversed(running):
            _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for process in running:
            assert process.popen is not None
            try:
                process.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for process in running:  # the group may outlive its leader: sweep it
            _signal_group(process, signal.SIGKILL)
            assert process.popen is not None
            process.popen.wait()
        self._remove_state()

    def _write_state(self) -> None:
        path = run_state_path(self.settings)
        path.parent.mkdir(parents=True, exist_ok=True)
        state = {
            "launcher_pid": os.getpid(),
            "processes": [{"name": p.name, "pid": p.pid} for p in self.processes],
            "services": {s: self.settings.service_url(s) for s in self.services},
        }
        staged = path.with_suffix(".tmp")
        staged.write_text(json.dumps(state, indent=2))
        staged.replace(path)  # whole, so `kernelzero status` never reads half of it

    def _remove_state(self) -> None:
        """Remove the state file if this launcher wrote it (the lock makes that so; this holds without it too)."""
        path = run_state_path(self.settings)
        try:
            if json.loads(path.read_text()).get("launcher_pid") == os.getpid():
                path.unlink()
        except (FileNotFoundError, json.JSONDecodeError):
            pass


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


def _how_it_ended(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def _bind_problem(host: str, port: int) -> str | None:
    """Why a server could not listen on ``host:port`` now, or None. Bound with SO_REUSEADDR, as uvicorn and
    Redis bind, so the TIME_WAIT connections a stopped server leaves behind do not count as in use."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return f"is in use{_listener(port)}"
        return f"cannot be listened on ({exc.strerror or exc})"
    return None


def _listener(port: int) -> str:
    """``" by pid N (command)"`` for the process listening on ``port``, where this user may see it."""
    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                return f" by pid {conn.pid} ({' '.join(psutil.Process(conn.pid).cmdline())[:120]})"
    except (psutil.Error, OSError):
        pass
    return ""

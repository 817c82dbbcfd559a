"""Servers run for real: the whole platform by ``kernelzero up`` (``start_up``, ``wait_until_up``), a
service's app by a uvicorn process, as ``kernelzero up`` serves it (``serve``, or ``ServiceProcess`` for one a
test kills and starts again), an app object by uvicorn in a thread (``serving``), and a private
``redis-server`` that a test may kill and start again (``RedisServer``), and a throwaway PostgreSQL
database (``created_database``)."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import redis
import uvicorn
from fastapi import FastAPI
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from services.clients import (
    CoderClient,
    ProposerClient,
    RetryPolicy,
    RewardClient,
    ServiceClient,
    ServiceUnreachable,
    TrainerClient,
)
from services.config import SERVICE_NAMES, Settings

KERNELZERO = Path(sys.executable).with_name("kernelzero")
CLIENTS: dict[str, type[ServiceClient]] = {
    "proposer": ProposerClient,
    "coder": CoderClient,
    "reward": RewardClient,
    "trainer": TrainerClient,
}


def pick_free_port() -> int:
    """A TCP port nothing listens on right now (the kernel picked it, then we let it go)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def created_database(admin_url: str) -> Iterator[str]:
    """A fresh PostgreSQL database, created through ``admin_url`` (a superuser's) and dropped after, even
    with connections still open to it; its URL. OperationalError when the server does not answer."""
    admin = create_engine(make_url(admin_url), isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3})
    name = f"kz_test_{secrets.token_hex(6)}"
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        admin.dispose()


def start_up(log: Path, *, sigint_ignored: bool = False) -> subprocess.Popen[bytes]:
    """``kernelzero up`` in the environment, its output to ``log``; ``sigint_ignored`` starts it as a script's
    ``&`` does (a shell without job control ignores SIGINT in a background job, and the child inherits that)."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(KERNELZERO), "up"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(os.environ),
            preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None,
        )


def interrupt_up(launcher: subprocess.Popen[bytes]) -> int:
    """Ctrl-C to ``kernelzero up`` (it puts SIGINT back even where it was started with it ignored) and
    its exit code; killed, and the wait's timeout raised, if it has not stopped in 60 s."""
    launcher.send_signal(signal.SIGINT)
    try:
        return launcher.wait(timeout=60)
    except subprocess.TimeoutExpired:
        launcher.kill()
        raise


def wait_until_up(launcher: subprocess.Popen[bytes], log: Path, settings: Settings, timeout_s: float = 120) -> None:
    """Until every service answers its readiness check through its typed client (the key ``up`` made)."""
    deadline = time.monotonic() + timeout_s
    pending = set(SERVICE_NAMES)
    while pending:
        if launcher.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"kernelzero up: {sorted(pending)} not ready (exit {launcher.poll()}):\n{log.read_text()[-4000:]}")
        if settings.api_key_file.exists():
            for service in sorted(pending):
                try:
                    with CLIENTS[service](retry=RetryPolicy(max_retries=0)) as client:  # this loop polls
                        if client.readiness().ready:
                            pending.discard(service)
                except ServiceUnreachable:
                    pass
        time.sleep(0.5)


@dataclass
class ServiceProcess:
    """A service's app in a uvicorn process as ``kernelzero up`` runs it, which a test may SIGKILL and start
    again on the same port (the launcher's restart)."""

    app: str
    port: int
    log_path: Path | None = None  # its output, appended across restarts; None: thrown away
    popen: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, ready_timeout_s: float = 30, **env: str) -> None:
        """Start it (``env`` on top of this process's environment), and return once its readiness check answers."""
        with self.log_path.open("ab") if self.log_path else open(os.devnull, "wb") as log:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", self.app, "--port", str(self.port), "--no-access-log"],
                env=dict(os.environ) | env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline and self.popen.poll() is None:
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        exit_code = self.popen.poll()
        self.kill()
        raise RuntimeError(f"{self.app} not ready on port {self.port} after {ready_timeout_s} s (exit {exit_code})")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def kill(self) -> None:
        """SIGKILL: no shutdown, requests in flight cut off."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


@contextmanager
def serve(app: str, port: int) -> Iterator[str]:
    """uvicorn as ``kernelzero up`` runs it, until its readiness check answers."""
    service = ServiceProcess(app, port)
    try:
        service.start()
        yield service.url
    finally:
        service.stop()


@dataclass
class RedisServer:
    """A ``redis-server`` of a test's own on ``port``, its files in ``directory``: with AOF (every write
    synced before it is answered, so a SIGKILL loses nothing acknowledged) or with no persistence at all
    (a restart starts empty, as the Redis ``kernelzero up`` starts does)."""

    port: int
    directory: Path
    appendonly: bool
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, ready_timeout_s: float = 10) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        persistence = ["--appendonly", "yes", "--appendfsync", "always"] if self.appendonly else ["--appendonly", "no"]
        self.popen = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory), "--save", ""]
            + persistence
            + ["--logfile", str(self.directory / "redis.log")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url, socket_connect_timeout=1)
        deadline = time.monotonic() + ready_timeout_s
        while True:
            try:
                if client.ping():
                    return
            except redis.RedisError:
                if self.popen.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"redis-server on port {self.port} did not start: see {self.directory / 'redis.log'}"
                    ) from None
                time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL: no save, no goodbye to its clients."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait()


@contextmanager
def serving(app: FastAPI) -> Iterator[str]:
    """``app`` under uvicorn on a port the kernel picks, in a thread; yields its /v1 base URL."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(10)

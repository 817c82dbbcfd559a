"""HTTP apps served for real: the whole platform by ``kernelzero up`` (``start_up``, ``wait_until_up``), a
service's by a uvicorn process, as ``kernelzero up`` serves it (``serve``), or an app object by uvicorn in a
thread (``serving``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

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


@contextmanager
def serve(app: str, port: int) -> Iterator[str]:
    """uvicorn as ``kernelzero up`` runs it, until its readiness check answers."""
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", app, "--port", str(port)],
        env=dict(os.environ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        server.wait(10)


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

"""HTTP apps served for real: a service's by a uvicorn process, as ``kernelzero up`` serves it (``serve``), or
an app object by uvicorn in a thread (``serving``)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import uvicorn
from fastapi import FastAPI


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

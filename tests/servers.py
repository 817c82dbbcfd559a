"""A service's HTTP app served by a real uvicorn process, as ``kernelzero up`` serves it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx


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

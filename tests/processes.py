"""Which processes a test left running: the platform's services, workers and sandboxed children."""

from __future__ import annotations

import os
from pathlib import Path

import psutil


def leftovers(data_dir: Path, pids: set[int]) -> list[str]:
    """Live processes that were started for this platform: by pid, or naming its data dir."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        if proc.pid == os.getpid() or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            environ = proc.environ()
        except (psutil.AccessDenied, psutil.NoSuchProcess):
            environ = {}
        cmdline = " ".join(proc.info["cmdline"] or [])
        if proc.pid in pids or environ.get("KZ_DATA_DIR") == str(data_dir) or str(data_dir) in cmdline:
            found.append(f"{proc.pid} {cmdline}")
    return found

"""Worker apps with jobs only the tests need; started like a service worker (``-A worker_apps``)."""

from __future__ import annotations

import os
import time
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded

from services.config import get_settings
from services.queue import unfit
from services.queue.worker import create_worker_app

STUBBORN = "test.stubborn"
UNFIT_ONCE = "test.unfit_once"
FAILS_UNFIT_ONCE = "test.fails_unfit_once"


def ignore_soft_time_limit(job_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    """Works on past the soft time limit, as a hung kernel would: only the hard limit stops it."""
    deadline = time.monotonic() + float(payload["seconds"])
    while time.monotonic() < deadline:
        try:
            time.sleep(0.05)
        except SoftTimeLimitExceeded:
            pass
    return {"finished": True}


def unfit_the_first_time(job_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    """Finds its process unfit on its first attempt (as a judge that met a lost CUDA context does), then works."""
    marker = get_settings().data_dir / f"unfit-{job_id}"
    if not marker.exists():
        marker.write_text(str(os.getpid()))
        unfit.declare("the CUDA context of cuda:0 failed: an illegal memory access was encountered")
    return {"pid": os.getpid(), "unfit_pid": int(marker.read_text())}


def _poisoned() -> str | None:
    """This process's fitness check (as the reward worker's looks at its CUDA contexts): unfit once poisoned."""
    return (
        "poisoned: a context lost where no judge looked"
        if (get_settings().data_dir / f"poisoned-{os.getpid()}").exists()
        else None
    )


def poison_then_fail_the_first_time(job_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    """Poisons its process and fails with an ordinary error on its first attempt (a cleanup that met a lost
    context), then works: only the check run after a failed job can tell it was the process's failure."""
    marker = get_settings().data_dir / f"failed-{job_id}"
    if not marker.exists():
        marker.write_text(str(os.getpid()))
        (get_settings().data_dir / f"poisoned-{os.getpid()}").touch()
        raise RuntimeError("CUDA error: an illegal memory access was encountered (in a cleanup)")
    return {"pid": os.getpid(), "unfit_pid": int(marker.read_text())}


unfit.add_check(_poisoned)
app = create_worker_app(
    "trainer",
    jobs={STUBBORN: ignore_soft_time_limit, UNFIT_ONCE: unfit_the_first_time, FAILS_UNFIT_ONCE: poison_then_fail_the_first_time},
)

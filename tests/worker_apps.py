"""Worker apps with jobs only the tests need; started like a service worker (``-A worker_apps``)."""

from __future__ import annotations

import os
import time
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded

from services.config import get_settings
from services.queue.unfit import ProcessUnfit
from services.queue.worker import create_worker_app

STUBBORN = "test.stubborn"
UNFIT_ONCE = "test.unfit_once"


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
        raise ProcessUnfit("the CUDA context of cuda:0 failed: an illegal memory access was encountered")
    return {"pid": os.getpid(), "unfit_pid": int(marker.read_text())}


app = create_worker_app("trainer", jobs={STUBBORN: ignore_soft_time_limit, UNFIT_ONCE: unfit_the_first_time})

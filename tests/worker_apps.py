"""Worker apps with jobs only the tests need; started like a service worker (``-A worker_apps``)."""

from __future__ import annotations

import time
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded

from services.queue.worker import create_worker_app

STUBBORN = "test.stubborn"


def ignore_soft_time_limit(job_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    """Works on past the soft time limit, as a hung kernel would: only the hard limit stops it."""
    deadline = time.monotonic() + float(payload["seconds"])
    while time.monotonic() < deadline:
        try:
            time.sleep(0.05)
        except SoftTimeLimitExceeded:
            pass
    return {"finished": True}


app = create_worker_app("trainer", jobs={STUBBORN: ignore_soft_time_limit})

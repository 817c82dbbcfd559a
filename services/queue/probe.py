"""The probe job: a diagnostic every worker runs, proving queue, worker and database work together."""

from __future__ import annotations

import os
import socket
import time
from typing import Any


def probe(job_id: str, payload: dict[str, Any]) -> dict[str, Any]:
    started = time.time()
    time.sleep(float(payload.get("sleep_s", 0.0)))
    return {"token": payload.get("token"), "pid": os.getpid(), "host": socket.gethostname(), "slept_s": time.time() - started}

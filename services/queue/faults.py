"""Deterministic fault points: where a test makes a worker die, named after the window it dies in.

``KZ_FAULT_POINT`` (a comma-separated list of names) makes the process that reaches a listed point
SIGKILL itself there, as an OOM kill or a lost machine would: no handler, no cleanup, nothing
flushed. Each point fires once per data dir (a marker file taken with ``O_EXCL`` decides), so the
job's next attempt passes it and the test sees what that attempt does with what the dead one left.
Unset, a fault point is one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

from services.config import get_settings

ENV = "KZ_FAULT_POINT"


def fault_point(name: str, about: str = "") -> None:
    """Die here if ``KZ_FAULT_POINT`` names this point and it has not fired yet; ``about`` (what the process
    was doing: a job's id) is left in the marker, for the test to know which work the death interrupted."""
    points = os.environ.get(ENV)
    if not points or name not in points.split(","):
        return
    markers = get_settings().data_dir / "faults"
    markers.mkdir(parents=True, exist_ok=True)
    try:
        marker = os.open(markers / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:  # fired already: this is a later attempt
        return
    os.write(marker, about.encode())
    os.close(marker)
    os.kill(os.getpid(), signal.SIGKILL)

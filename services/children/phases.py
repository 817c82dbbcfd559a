"""Where a child's time went, reported with its result."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from services.children.device import DeviceLockDescriptors, gpu_lock


class Phases:
    """Seconds per phase of a child's job, reported with its result: where the time went."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._mark = time.perf_counter()

    def lap(self, name: str) -> None:
        """Charge the time since the previous lap to ``name`` (repeated names add up)."""
        now = time.perf_counter()
        self.seconds[name] = round(self.seconds.get(name, 0.0) + now - self._mark, 3)
        self._mark = now

    @contextlib.contextmanager
    def on_device(self, lock: str | DeviceLockDescriptors | None, work: str, *, exclusive: bool = False) -> Iterator[None]:
        """A block of GPU work under the device lock, charged to ``work``; the wait to ``lock_wait``
        and anything since the last lap to ``host``."""
        self.lap("host")
        with gpu_lock(lock, exclusive=exclusive):
            self.lap("lock_wait")
            yield
            self.lap(work)

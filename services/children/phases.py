"""Where a child's time went, reported with its result."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from services.children.device import DeviceLockDescriptors, gpu_lock, released_totals


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
        and anything since the last lap to ``host``. Where the block let the device go for CPU work
        (``device_released``: a Triton compile), that time goes to ``released`` and the wait to take
        the device back to ``lock_wait``."""
        self.lap("host")
        with gpu_lock(lock, exclusive=exclusive):
            self.lap("lock_wait")
            released_before, retake_before = released_totals()
            yield
            self.lap(work)
            released_after, retake_after = released_totals()
        released, retake_wait = released_after - released_before, retake_after - retake_before
        if released or retake_wait:
            self.seconds[work] = max(0.0, round(self.seconds[work] - released - retake_wait, 3))
            self.seconds["released"] = round(self.seconds.get("released", 0.0) + released, 3)
            self.seconds["lock_wait"] = round(self.seconds["lock_wait"] + retake_wait, 3)


class HoldSplit:
    """One phase's device holds split by what ran in them (a candidate's trials: its warm-ups, trials,
    knockout, refresh and recall, and the takes of their outputs), less any time a hold let the device
    go (``device_released``): where a phase's seconds under the lock go when it is long."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._mark = time.perf_counter()
        self._released = 0.0

    def start(self) -> None:
        """The hold's work starts now."""
        self._mark, self._released = time.perf_counter(), sum(released_totals())

    def lap(self, name: str) -> None:
        """Charge the hold's time since ``start`` or the previous lap to ``name`` (repeated names add up)."""
        now, released = time.perf_counter(), sum(released_totals())
        spent = max(0.0, now - self._mark - (released - self._released))
        self.seconds[name] = round(self.seconds.get(name, 0.0) + spent, 3)
        self._mark, self._released = now, released

"""Loading what a child runs: a module from a file (Triton reads its kernels' source there), the GPU lock."""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path


def import_file(path: Path, module_name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def gpu_lock(path: str | None, *, exclusive: bool = False) -> Iterator[None]:
    """The device lock for one block of GPU work. A reader-writer ``flock``: correctness work
    (reference and candidate trials, the judge) holds it shared and overlaps with other jobs';
    timing holds it exclusive, so nothing else runs on the GPU while a kernel is timed. CPU work
    (making inputs, writing files) runs outside it."""
    if not path:
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield


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
    def on_device(self, lock: str | None, work: str, *, exclusive: bool = False) -> Iterator[None]:
        """A block of GPU work under the device lock, charged to ``work``; the wait to ``lock_wait``
        and anything since the last lap to ``host``."""
        self.lap("host")
        with gpu_lock(lock, exclusive=exclusive):
            self.lap("lock_wait")
            yield
            self.lap(work)

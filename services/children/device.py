"""The device lock: GPU work of every child and worker takes it, shared for correctness work, exclusive for timing."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypedDict


class DeviceLockDescriptors(TypedDict):
    """A child's device lock as its job spec carries it (``DeviceLock.to_json``)."""

    lock_fd: int
    timings_fd: int
    gate_fd: int


_holds = threading.local()  # the hold a thread is inside, so CPU work within it can let it go

TIMINGS_SUFFIX = ".timings"  # beside the lock file: held shared by every timing from its request to its end
GATE_SUFFIX = ".gate"  # held exclusive by the TimingGate while correctness work has the device to itself
KEEPER_SUFFIX = ".gatekeeper"  # held by the one TimingGate of a device lock (another process's waits to take over)
LOCK_FILES = ("", TIMINGS_SUFFIX, GATE_SUFFIX)  # what a holder opens: the device lock itself, then the two above


@dataclass(frozen=True)
class DeviceLock:
    """The device lock as a sandboxed child holds it: two descriptors its pool opened on the lock file
    and its timings file (read-only; ``flock`` needs no more) and passed to it at start, so no child can
    write to, replace or leave anything in the locks directory, which it does not see at all."""

    lock_fd: int
    timings_fd: int
    gate_fd: int

    @staticmethod
    def open(path: str) -> DeviceLock:
        return DeviceLock(*(os.open(path + suffix, os.O_RDONLY | os.O_CREAT, 0o644) for suffix in LOCK_FILES))

    @property
    def fds(self) -> tuple[int, int, int]:
        return self.lock_fd, self.timings_fd, self.gate_fd

    def close(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)

    def to_json(self) -> DeviceLockDescriptors:
        return {"lock_fd": self.lock_fd, "timings_fd": self.timings_fd, "gate_fd": self.gate_fd}


def _take(lock_fd: int, timings_fd: int, mode: int, gate_fd: int | None = None) -> None:
    """Timings go in batches. A timing passes the gate (``TimingGate``: shut while correctness work has
    its window), announces itself (a shared hold on the timings file, kept to its end), then waits for
    the device lock exclusive: the shared holders drain once and nobody new joins them, since
    correctness work starts only when no timing is announced (it takes the timings file exclusive for
    a moment, which waits for every announced timing to end). Timings announced meanwhile run back to
    back after the first, without a drain each: the drain, with the GPU idling behind its slowest
    holder, is paid once per batch, not once per timing. Linux ``flock`` grants new shared holds while
    an exclusive request waits, which is what lets a batch grow; correctness work waits at most for
    the timings of children that finished their own. Locks are taken in one order (gate, timings,
    lock), so none waits in a cycle."""
    if mode == fcntl.LOCK_EX:
        if gate_fd is not None:
            fcntl.flock(gate_fd, fcntl.LOCK_SH)
        try:
            fcntl.flock(timings_fd, fcntl.LOCK_SH)
        finally:
            if gate_fd is not None:
                fcntl.flock(gate_fd, fcntl.LOCK_UN)  # announced: the gate may shut behind it
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        except BaseException:
            fcntl.flock(timings_fd, fcntl.LOCK_UN)
            raise
        return
    fcntl.flock(timings_fd, fcntl.LOCK_EX)  # no timing announced: none can hold the device either
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_SH)
    finally:
        fcntl.flock(timings_fd, fcntl.LOCK_UN)


def _give(lock_fd: int, timings_fd: int, mode: int) -> None:
    fcntl.flock(lock_fd, fcntl.LOCK_UN)
    if mode == fcntl.LOCK_EX:
        fcntl.flock(timings_fd, fcntl.LOCK_UN)


@contextlib.contextmanager
def gpu_lock(lock: str | DeviceLockDescriptors | None, *, exclusive: bool = False) -> Iterator[None]:
    """The device lock for one block of GPU work. A reader-writer ``flock``: correctness work
    (reference and candidate trials, the judge) holds it shared and overlaps with other jobs';
    timing holds it exclusive, so nothing else runs on the GPU while a kernel is timed. CPU work
    (making inputs, writing files) runs outside it. Timings are served in batches (``_take``).
    ``lock`` is the lock file's path (the worker) or a child's ``DeviceLock.to_json()``."""
    if not lock:
        yield
        return
    mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
    with contextlib.ExitStack() as stack:
        if isinstance(lock, dict):
            lock_fd, timings_fd, gate_fd = lock["lock_fd"], lock["timings_fd"], lock.get("gate_fd")
        else:
            lock_fd, timings_fd, gate_fd = (stack.enter_context(open(lock + s, "a")).fileno() for s in LOCK_FILES)
        _take(lock_fd, timings_fd, mode, gate_fd)
        stack.callback(_give, lock_fd, timings_fd, mode)
        outer, _holds.current = getattr(_holds, "current", None), (lock_fd, timings_fd, mode)
        try:
            yield
        finally:
            _holds.current = outer


@contextlib.contextmanager
def device_released() -> Iterator[None]:
    """Long CPU work inside a shared hold (Triton compiling a kernel at its first launch) lets the
    lock go meanwhile: a timing waiting for the device waits for GPU work, not for a compiler.
    An exclusive hold is kept: it is timing, and a compile there is part of what is measured."""
    hold = getattr(_holds, "current", None)
    if hold is None or hold[2] == fcntl.LOCK_EX:
        yield
        return
    import torch

    if torch.cuda.is_available():  # none of this process's work is left running beside someone's timing
        torch.cuda.synchronize()
    lock_fd, timings_fd, mode = hold
    _give(lock_fd, timings_fd, mode)
    released = time.perf_counter()
    try:
        yield
    finally:
        retaking = time.perf_counter()
        _take(lock_fd, timings_fd, mode)
        _holds.released_s = getattr(_holds, "released_s", 0.0) + retaking - released
        _holds.retake_wait_s = getattr(_holds, "retake_wait_s", 0.0) + time.perf_counter() - retaking


def released_totals() -> tuple[float, float]:
    """Running totals on this thread: (seconds its holds let the device go for CPU work, seconds spent
    taking it back). The difference across a hold tells its time apart into work, a compile and a wait."""
    return getattr(_holds, "released_s", 0.0), getattr(_holds, "retake_wait_s", 0.0)


class TimingGate:
    """Gives correctness work the device for a window between timing batches, so timings gather into
    fewer, larger batches. Without it a timing announced itself the moment its candidate was ready:
    every few seconds the shared holders drained (the GPU idling behind the slowest) for a batch of
    one or two, and a candidate, which takes the device once per trial, waited out a whole drain and
    batch for most of its trials. The gate shuts when a batch ends; timings asking meanwhile wait at
    it (``_take``); it opens after ``window_s``, or sooner once no correctness work holds the device (a
    lone score never waits for it), and shuts again once the timings waiting have announced.

    One thread per process that evaluates on the device; across processes one gate per device lock
    (the keeper file's holder), the others wait to take over from it. A gate nobody keeps is open:
    timings then go as they come."""

    OPEN_S = 0.05  # the gate stays open this long: the timings waiting at it pass (each takes it shared)
    POLL_S = 0.05  # how often the window looks for correctness work still holding the device

    def __init__(self, path: str, window_s: float) -> None:
        self.path, self.window_s = path, window_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kz-timing-gate", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        with contextlib.ExitStack() as files:
            opened = (files.enter_context(open(self.path + suffix, "a")).fileno() for suffix in (*LOCK_FILES, KEEPER_SUFFIX))
            lock, timings, gate, keeper = opened
            fcntl.flock(keeper, fcntl.LOCK_EX)  # released with the file: at close, or when this process dies
            while not self._stop.is_set():
                fcntl.flock(gate, fcntl.LOCK_EX)  # shut: a timing asking from now waits
                fcntl.flock(timings, fcntl.LOCK_EX)  # the batch let in last has ended
                fcntl.flock(timings, fcntl.LOCK_UN)
                self._window(lock)
                fcntl.flock(gate, fcntl.LOCK_UN)
                self._stop.wait(self.OPEN_S)

    def _window(self, lock: int) -> None:
        """Until ``window_s`` passed, or no correctness work holds the device (nothing would drain)."""
        deadline = time.monotonic() + self.window_s
        while not self._stop.wait(self.POLL_S) and time.monotonic() < deadline:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            fcntl.flock(lock, fcntl.LOCK_UN)
            return


def resolve_device(requested: str) -> str:
    if requested != "auto":
        return requested
    return "cuda" if _cuda_available() else "cpu"


@functools.cache
def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()

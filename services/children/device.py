"""The device lock: GPU work of every child and worker takes it, shared for correctness work, exclusive for timing."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypedDict


class DeviceLockDescriptors(TypedDict):
    """A child's device lock as its job spec carries it (``DeviceLock.to_json``)."""

    lock_fd: int
    timings_fd: int
    seat_fds: list[int]


_holds = threading.local()  # the hold a thread is inside, so CPU work within it can let it go

TIMINGS_SUFFIX = ".timings"  # beside the lock file: held shared by every timing from its request to its end
SEAT_SUFFIX = ".seat"  # beside the lock file, numbered: a child's correctness hold takes one of them exclusive


@dataclass(frozen=True)
class DeviceLock:
    """The device lock as a sandboxed child holds it: two descriptors its pool opened on the lock file
    and its timings file (read-only; ``flock`` needs no more) and passed to it at start, so no child can
    write to, replace or leave anything in the locks directory, which it does not see at all."""

    lock_fd: int
    timings_fd: int
    seat_fds: tuple[int, ...] = ()

    @staticmethod
    def open(path: str, seats: int = 0) -> DeviceLock:
        """``seats``: how many children may hold the device shared at once (0: no limit)."""

        def descriptor(name: str) -> int:
            return os.open(name, os.O_RDONLY | os.O_CREAT, 0o644)

        seat_fds = tuple(descriptor(f"{path}{SEAT_SUFFIX}{i}") for i in range(seats))
        return DeviceLock(descriptor(path), descriptor(path + TIMINGS_SUFFIX), seat_fds)

    @property
    def fds(self) -> tuple[int, ...]:
        return (self.lock_fd, self.timings_fd, *self.seat_fds)

    def close(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)

    def to_json(self) -> DeviceLockDescriptors:
        return {"lock_fd": self.lock_fd, "timings_fd": self.timings_fd, "seat_fds": list(self.seat_fds)}


def _take_seat(seat_fds: tuple[int, ...]) -> int | None:
    """One of the seats, for a correctness hold: the first free one from a random start, else the wait
    for the seat at the start. The GPU runs different processes' kernels by time slices, not side
    by side, so every holder beyond a few makes each sync of the others wait its turn, and a timing's
    drain wait for more of them; the seats bound how many hold the device shared at once."""
    if not seat_fds:
        return None
    start = random.randrange(len(seat_fds))
    for i in range(len(seat_fds)):
        fd = seat_fds[(start + i) % len(seat_fds)]
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue
        return fd
    fcntl.flock(seat_fds[start], fcntl.LOCK_EX)
    return seat_fds[start]


@dataclass
class _Hold:
    """One hold of the device lock: its descriptors, its mode, and the seat a correctness hold took."""

    lock_fd: int
    timings_fd: int
    exclusive: bool
    seat_fds: tuple[int, ...] = ()
    seat: int | None = None

    def take(self) -> None:
        """Timings go in batches. A timing announces itself first (a shared hold on the timings file,
        kept to its end), then waits for the device lock exclusive: the shared holders drain once and
        nobody new joins them, since correctness work starts only when no timing is announced (it takes
        the timings file exclusive for a moment, which waits for every announced timing to end).
        Timings announced meanwhile run back to back after the first, without a drain each: the drain,
        with the GPU idling behind its slowest holder, is paid once per batch, not once per timing.
        Linux ``flock`` grants new shared holds while an exclusive request waits, which is what lets a
        batch grow; correctness work waits at most for the timings of children that finished their
        own. A correctness hold takes its seat (``_take_seat``) before all this."""
        if self.exclusive:
            fcntl.flock(self.timings_fd, fcntl.LOCK_SH)
            try:
                fcntl.flock(self.lock_fd, fcntl.LOCK_EX)
            except BaseException:
                fcntl.flock(self.timings_fd, fcntl.LOCK_UN)
                raise
            return
        self.seat = _take_seat(self.seat_fds)
        try:
            fcntl.flock(self.timings_fd, fcntl.LOCK_EX)  # no timing announced: none can hold the device either
            try:
                fcntl.flock(self.lock_fd, fcntl.LOCK_SH)
            finally:
                fcntl.flock(self.timings_fd, fcntl.LOCK_UN)
        except BaseException:
            self._give_seat()
            raise

    def give(self) -> None:
        fcntl.flock(self.lock_fd, fcntl.LOCK_UN)
        if self.exclusive:
            fcntl.flock(self.timings_fd, fcntl.LOCK_UN)
        self._give_seat()

    def _give_seat(self) -> None:
        if self.seat is not None:
            fcntl.flock(self.seat, fcntl.LOCK_UN)
            self.seat = None


@contextlib.contextmanager
def gpu_lock(lock: str | DeviceLockDescriptors | None, *, exclusive: bool = False) -> Iterator[None]:
    """The device lock for one block of GPU work. A reader-writer ``flock``: correctness work
    (reference and candidate trials, the judge) holds it shared and overlaps with other jobs';
    timing holds it exclusive, so nothing else runs on the GPU while a kernel is timed. CPU work
    (making inputs, writing files) runs outside it. Timings are served in batches (``_Hold.take``).
    ``lock`` is the lock file's path (the worker, whose judge takes no seat) or a child's
    ``DeviceLock.to_json()``."""
    if not lock:
        yield
        return
    with contextlib.ExitStack() as stack:
        if isinstance(lock, dict):
            hold = _Hold(lock["lock_fd"], lock["timings_fd"], exclusive, tuple(lock["seat_fds"]))
        else:
            lock_fd = stack.enter_context(open(lock, "a")).fileno()
            hold = _Hold(lock_fd, stack.enter_context(open(lock + TIMINGS_SUFFIX, "a")).fileno(), exclusive)
        hold.take()
        stack.callback(hold.give)
        outer, _holds.current = getattr(_holds, "current", None), hold
        try:
            yield
        finally:
            _holds.current = outer


@contextlib.contextmanager
def device_released() -> Iterator[None]:
    """Long CPU work inside a shared hold (Triton compiling a kernel at its first launch) lets the
    lock (and its seat) go meanwhile: a timing or a child waiting for the device waits for GPU work,
    not for a compiler. An exclusive hold is kept: it is timing, and a compile there is part of what
    is measured."""
    hold: _Hold | None = getattr(_holds, "current", None)
    if hold is None or hold.exclusive:
        yield
        return
    import torch

    if torch.cuda.is_available():  # none of this process's work is left running beside someone's timing
        torch.cuda.synchronize()
    hold.give()
    released = time.perf_counter()
    try:
        yield
    finally:
        retaking = time.perf_counter()
        hold.take()
        _holds.released_s = getattr(_holds, "released_s", 0.0) + retaking - released
        _holds.retake_wait_s = getattr(_holds, "retake_wait_s", 0.0) + time.perf_counter() - retaking


def released_totals() -> tuple[float, float]:
    """Running totals on this thread: (seconds its holds let the device go for CPU work, seconds spent
    taking it back). The difference across a hold tells its time apart into work, a compile and a wait."""
    return getattr(_holds, "released_s", 0.0), getattr(_holds, "retake_wait_s", 0.0)


NVIDIA_DEVICE_NODES = ("/dev/nvidiactl", "/dev/dxg")  # the driver's control node (WSL 2: its GPU node): CUDA opens one


def likely_device(requested: str) -> str:
    """What ``resolve_device`` will answer, without importing torch (seconds of a fresh CLI's time): a
    host (or container) without NVIDIA's device nodes has no CUDA; one with them nearly always has."""
    if requested != "auto":
        return requested
    return "cuda" if any(os.path.exists(node) for node in NVIDIA_DEVICE_NODES) else "cpu"


def resolve_device(requested: str) -> str:
    if requested != "auto":
        return requested
    if likely_device(requested) == "cpu":  # certain without torch's word
        return "cpu"
    return "cuda" if _cuda_available() else "cpu"


@functools.cache
def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()

"""The device lock: GPU work of every child and worker takes it, shared for correctness work, exclusive for timing.
Also which device a request means, and whether this process's CUDA context still works (``context_lost``)."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypedDict


class DeviceLockDescriptors(TypedDict):
    """A child's device lock as its job spec carries it (``DeviceLock.to_json``)."""

    lock_fd: int
    timings_fd: int


_holds = threading.local()  # the hold a thread is inside, so CPU work within it can let it go

TIMINGS_SUFFIX = ".timings"  # beside the lock file: held shared by every timing from its request to its end


@dataclass(frozen=True)
class DeviceLock:
    """The device lock as a sandboxed child holds it: two descriptors its pool opened on the lock file
    and its timings file (read-only; ``flock`` needs no more) and passed to it at start, so no child can
    write to, replace or leave anything in the locks directory, which it does not see at all."""

    lock_fd: int
    timings_fd: int

    @staticmethod
    def open(path: str) -> DeviceLock:
        return DeviceLock(
            os.open(path, os.O_RDONLY | os.O_CREAT, 0o644), os.open(path + TIMINGS_SUFFIX, os.O_RDONLY | os.O_CREAT, 0o644)
        )

    def close(self) -> None:
        for fd in (self.lock_fd, self.timings_fd):
            with contextlib.suppress(OSError):
                os.close(fd)

    def to_json(self) -> DeviceLockDescriptors:
        return {"lock_fd": self.lock_fd, "timings_fd": self.timings_fd}


def _take(lock_fd: int, timings_fd: int, mode: int) -> None:
    """Timings go in batches. A timing announces itself first (a shared hold on the timings file, kept
    to its end), then waits for the device lock exclusive: the shared holders drain once and nobody
    new joins them, since correctness work starts only when no timing is announced (it takes the
    timings file exclusive for a moment, which waits for every announced timing to end). Timings
    announced meanwhile run back to back after the first, without a drain each: the drain, with the
    GPU idling behind its slowest holder, is paid once per batch, not once per timing. Linux
    ``flock`` grants new shared holds while an exclusive request waits, which is what lets a batch
    grow; correctness work waits at most for the timings of children that finished their own."""
    if mode == fcntl.LOCK_EX:
        fcntl.flock(timings_fd, fcntl.LOCK_SH)
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
            lock_fd, timings_fd = lock["lock_fd"], lock["timings_fd"]
        else:
            lock_fd = stack.enter_context(open(lock, "a")).fileno()
            timings_fd = stack.enter_context(open(lock + TIMINGS_SUFFIX, "a")).fileno()
        _take(lock_fd, timings_fd, mode)
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


def context_lost(device: str) -> str | None:
    """What failed, where this process's CUDA context on ``device`` is lost to a sticky error (an illegal
    address: every later CUDA call fails with it), else None. Waits for this thread's stream on the device,
    which allocates nothing (an allocation could fail for want of memory other processes hold, which says
    nothing about the context); a context never made is not lost."""
    if not device.startswith("cuda"):
        return None
    import torch

    if not torch.cuda.is_initialized():
        return None
    try:
        torch.cuda.current_stream(torch.device(device)).synchronize()
    except Exception as exc:
        return f"the CUDA context of {device} failed: {type(exc).__name__}: {exc}"[:500]
    return None


def contexts_lost() -> str | None:
    """``context_lost`` for each device this process made a context on (by torch's numbering here: a worker
    in a container sees its one GPU as device 0 whatever the host calls it), where torch was imported."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    made = getattr(torch._C, "_cuda_hasPrimaryContext", None)  # only in CUDA builds
    for index in range(torch.cuda.device_count()):
        if made is not None and not made(index):
            continue
        lost = context_lost(f"cuda:{index}")
        if lost:
            return lost
    return None

"""The device lock: GPU work of every child and worker takes it, shared for correctness work, exclusive for timing."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypedDict


class DeviceLockDescriptors(TypedDict):
    """A child's device lock as its job spec carries it (``DeviceLock.to_json``)."""

    lock_fd: int
    gate_fd: int


_holds = threading.local()  # the hold a thread is inside, so CPU work within it can let it go


@dataclass(frozen=True)
class DeviceLock:
    """The device lock as a sandboxed child holds it: two descriptors its pool opened on the lock file
    and its gate (read-only; ``flock`` needs no more) and passed to it at start, so no child can write
    to, replace or leave anything in the locks directory, which it does not see at all."""

    lock_fd: int
    gate_fd: int

    @staticmethod
    def open(path: str) -> DeviceLock:
        return DeviceLock(
            os.open(path, os.O_RDONLY | os.O_CREAT, 0o644), os.open(path + ".gate", os.O_RDONLY | os.O_CREAT, 0o644)
        )

    def close(self) -> None:
        for fd in (self.lock_fd, self.gate_fd):
            with contextlib.suppress(OSError):
                os.close(fd)

    def to_json(self) -> DeviceLockDescriptors:
        return {"lock_fd": self.lock_fd, "gate_fd": self.gate_fd}


def _take(lock_fd: int, gate: int | str, mode: int) -> None:
    """Through the turnstile: Linux ``flock`` grants new shared holds while an exclusive request
    waits, so under steady correctness work a timing could wait indefinitely. Every request first
    takes the gate (a mutex held only while queueing for the device lock); a timing keeps it until
    the current holders have drained, so new ones queue behind it."""
    if isinstance(gate, str):
        with open(gate, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            fcntl.flock(lock_fd, mode)
        return
    fcntl.flock(gate, fcntl.LOCK_EX)
    try:
        fcntl.flock(lock_fd, mode)
    finally:
        fcntl.flock(gate, fcntl.LOCK_UN)


@contextlib.contextmanager
def gpu_lock(lock: str | DeviceLockDescriptors | None, *, exclusive: bool = False) -> Iterator[None]:
    """The device lock for one block of GPU work. A reader-writer ``flock``: correctness work
    (reference and candidate trials, the judge) holds it shared and overlaps with other jobs';
    timing holds it exclusive, so nothing else runs on the GPU while a kernel is timed. CPU work
    (making inputs, writing files) runs outside it. Requests are served in turn (``_take``).
    ``lock`` is the lock file's path (the worker) or a child's ``DeviceLock.to_json()``."""
    if not lock:
        yield
        return
    mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
    gate: int | str
    with contextlib.ExitStack() as stack:
        if isinstance(lock, dict):
            lock_fd, gate = lock["lock_fd"], lock["gate_fd"]
        else:
            lock_fd, gate = stack.enter_context(open(lock, "a")).fileno(), lock + ".gate"
        _take(lock_fd, gate, mode)
        stack.callback(fcntl.flock, lock_fd, fcntl.LOCK_UN)
        outer, _holds.current = getattr(_holds, "current", None), (lock_fd, gate, mode)
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
    lock_fd, gate, mode = hold
    fcntl.flock(lock_fd, fcntl.LOCK_UN)
    try:
        yield
    finally:
        _take(lock_fd, gate, mode)


def resolve_device(requested: str) -> str:
    if requested != "auto":
        return requested
    return "cuda" if _cuda_available() else "cpu"


@functools.cache
def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()

"""A warm pool of sandboxed children, each serving one job (``entry.serve``), and the child itself.

Every service's untrusted code runs in one: the reward harness's reference and candidates, the
Proposer's module validation, the template generator's tracer. The pool starts children before
their jobs are known (torch imported, CUDA initialised, blocked on stdin), confines them
(``services.sandbox``) to their own work dir and read-only inboxes, and reads back the result they
sign (``report``) and what their audit hook refused.
"""

from __future__ import annotations

import collections
import json
import os
import secrets
import socket
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from services.children.device import DeviceLock
from services.children.files import link_tree, remove_tree
from services.children.layout import Layout, owner_tag
from services.children.report import AUDIT_LOG, KEY_FIELD, RESULT_FILE, read_result
from services.config import Settings
from services.sandbox import Confinement, KilledBeforeRun, SandboxProcess, SandboxResult

MAX_RESULT_BYTES = 64 << 20  # a child's result.json; a larger one is no result (it would be read into the worker)
MAX_AUDIT_BYTES = 64 << 10
READY_POLL_S = 0.005


class PoolClosed(RuntimeError):
    """A child was asked of a pool that was closed."""


FORGED_RESULT = {
    "status": "rejected",
    "guard": "harness_tampering",
    "reason": "the child's result is not the one its harness wrote (the signature does not match)",
}


@dataclass(eq=False)  # a child is itself: pools hold and remove it by identity
class Child:
    process: SandboxProcess
    workdir: Path
    inbox: Path | None = None  # read-only to the child: its group's inputs, linked in when the job is known
    build_inbox: Path | None = None  # read-only to the child: the published build of its source
    device_lock: DeviceLock | None = None  # the descriptors the child holds (the worker closed its copies)
    # a GPU child's device exchange: the worker's end of a socket pair whose other end the child holds
    # (at ``exchange_fd``); trial outputs arrive on it as descriptors of device memory (device_exchange.py)
    exchange: socket.socket | None = None
    exchange_fd: int | None = None
    audit: str = ""  # what the child's audit hook refused, a line each (the reward harness's candidates write it)

    def run(
        self, spec: Mapping[str, Any], max_result_bytes: int = MAX_RESULT_BYTES, wall_timeout_s: float | None = None
    ) -> tuple[SandboxResult, dict[str, Any] | None]:
        """Run the job within ``wall_timeout_s`` (its pool's unless given); the result the child wrote, or
        None. The spec is given the child's device lock,
        and a key the harness signs its result with (``report``): a result file written by
        anything else in the child (native code) does not verify and reads as ``FORGED_RESULT``.
        The audit log is made here and read back through this process's own descriptor
        (``audit``): the child's harness appends to the same file, whatever its work dir's name for
        it becomes (renamed away, replaced by a link or a FIFO)."""
        key = secrets.token_hex(32)
        spec = {
            **spec,
            KEY_FIELD: key,
            "gpu_lock": self.device_lock.to_json() if self.device_lock else None,
            "exchange_fd": self.exchange_fd,
        }
        log = os.open(self.workdir / AUDIT_LOG, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            try:
                outcome = self.process.run((json.dumps(spec) + "\n").encode(), wall_timeout_s)
            except KilledBeforeRun as killed:  # only its pool's close kills a child taken for a job
                raise PoolClosed(
                    "the sandbox pool was closed before this child's job started: its process is stopping"
                ) from killed
            self.audit = os.pread(log, MAX_AUDIT_BYTES, 0).decode(errors="replace")
        finally:
            os.close(log)
        result = read_result(self.workdir / RESULT_FILE, key, max_result_bytes)
        return outcome, dict(FORGED_RESULT) if result is False else result

    @property
    def ready(self) -> bool:
        return (self.workdir / "ready").exists()

    def wait_ready(self, timeout_s: float) -> bool:
        """Until the child has warmed up; False once it died or ``timeout_s`` passed. A job sent before
        waits in the child's stdin anyway: waiting here tells the wait for a child apart from its job."""
        deadline = time.monotonic() + timeout_s
        while not self.ready:
            if not self.process.alive or time.monotonic() > deadline:
                return False
            time.sleep(READY_POLL_S)
        return True

    def receive(self, exchange: Path | None = None, build: Path | None = None) -> None:
        """Link a group's input files and a source's published build into the child's read-only inboxes."""
        if exchange is not None and self.inbox is not None:
            link_tree(exchange, self.inbox)
        if build is not None and self.build_inbox is not None:
            link_tree(build, self.build_inbox)

    def discard(self) -> None:
        self.process.kill()
        if self.exchange is not None:
            self.exchange.close()
        for path in (self.workdir, self.inbox, self.build_inbox):
            if path is not None:
                remove_tree(path)


class ChildExtras(Protocol):
    """What a kind of child needs beyond what every child gets: environment variables and read-only
    dirs (the reward harness's Triton cache layers), and work done once per pool before its first
    child (building those layers)."""

    def env(self, workdir: Path) -> dict[str, str]: ...

    def readonly_dirs(self) -> tuple[Path, ...]: ...

    def prime(self, pool: ChildPool) -> None: ...


class ChildPool:
    """Keeps ``size`` children warm (torch imported, CUDA initialised, blocked on stdin).

    ``entry`` is the child's module (``python -m ENTRY WORKDIR DEVICE``, built on ``entry.serve``):
    the reward harness, the Proposer's validation child, the template's tracer; ``extras`` what its
    kind needs besides; ``exchange``: GPU children get a device exchange socket (``Child.exchange``).
    """

    def __init__(
        self,
        settings: Settings,
        layout: Layout,
        device: str,
        timeout_s: float,
        size: int,
        entry: str,
        extras: ChildExtras | None = None,
        exchange: bool = False,
    ) -> None:
        self.settings, self.layout, self.device, self.timeout_s, self.size = settings, layout, device, timeout_s, size
        self.entry, self.extras, self.exchange = entry, extras, exchange
        self._warm: collections.deque[Child] = collections.deque()
        self._taken: weakref.WeakSet[Child] = weakref.WeakSet()  # running a job now: close() stops them too
        self._closed = False
        self._lock = threading.Lock()
        # bwrap's --die-with-parent follows the *thread* that started a child: every child is
        # started from this one long-lived thread, so a warm child outlives the job thread that
        # asked for it.
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kz-child-spawner")
        if extras is not None:
            extras.prime(self)
        self.refill()

    def confinement(self, workdir: Path, inbox: Path | None = None, build_inbox: Path | None = None) -> Confinement:
        env = {
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
            "TRITON_CACHE_DIR": str(workdir / "triton"),
            "TORCH_EXTENSIONS_DIR": str(workdir / "torch_extensions"),
            "OMP_NUM_THREADS": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            **(self.extras.env(workdir) if self.extras is not None else {}),
        }
        if self.device == "cpu":
            env["TRITON_INTERPRET"] = "1"
        for name in ("CUDA_VISIBLE_DEVICES", "CUDA_HOME", "LD_LIBRARY_PATH"):
            if name in os.environ:
                env[name] = os.environ[name]
        shared = self.extras.readonly_dirs() if self.extras is not None else ()
        return Confinement(
            wall_timeout_s=self.timeout_s,
            memory_bytes=None if self.device == "cuda" else self.settings.sandbox_memory_bytes,
            max_file_bytes=self.settings.reward_max_file_bytes,
            writable_dirs=(workdir,),
            # its own inboxes and what its kind shares, never another child's files or the locks
            readonly_dirs=tuple(p for p in (inbox, build_inbox, *shared) if p is not None and p.is_dir()),
            hidden_dirs=tuple(filter(None, (self.settings.data_dir, self.layout.scratch))),  # other jobs' files
            env=env,
            gpu=self.device == "cuda",
        )

    def spawn(self) -> Child:
        """A new child, started from the spawner thread (not one of the warm ones)."""
        return self._spawner.submit(self._spawn_here).result()

    def _spawn_here(self) -> Child:
        name = f"{owner_tag()}-{uuid.uuid4().hex}"  # the owner: see Layout.sweep_orphans
        workdir, inbox, build_inbox = self.layout.jobs / name, self.layout.jobs / f"{name}.in", self.layout.build_inboxes / name
        for path in (workdir, inbox, build_inbox):
            path.mkdir(parents=True)
        # absolute: a child starts in its work dir, and an interpreter found through a relative PATH entry is relative
        argv = [os.path.abspath(sys.executable), "-m", self.entry, str(workdir), self.device]
        lock_path = self.layout.gpu_lock(self.device)
        lock = DeviceLock.open(lock_path) if lock_path else None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) if lock and self.exchange else (None, None)
        try:
            process = SandboxProcess(
                argv,
                self.confinement(workdir, inbox, build_inbox),
                cwd=workdir,
                pass_fds=(lock.lock_fd, lock.timings_fd) + ((theirs.fileno(),) if theirs else ()) if lock else (),
            )
        except BaseException:
            if ours is not None:
                ours.close()
            raise
        finally:
            if lock:
                lock.close()  # the child holds its own copies, at the same numbers
            exchange_fd = theirs.fileno() if theirs else None
            if theirs is not None:
                theirs.close()
        return Child(process, workdir, inbox, build_inbox, lock, exchange=ours, exchange_fd=exchange_fd)

    def refill(self) -> None:
        with self._lock:
            while len(self._warm) < self.size and not self._closed:
                self._warm.append(self.spawn())

    def take(self) -> Child:
        """A live child, one that finished warming up if any has, else the one that will soonest, once it
        has (or died, or the pool's timeout passed): the caller's clock for its job starts warm."""
        with self._lock:
            if self._closed:
                raise PoolClosed("the sandbox pool is closed: its process is stopping")
            for child in [c for c in self._warm if not c.process.alive]:
                self._warm.remove(child)
                child.discard()
            if self._warm:
                child = next((c for c in self._warm if c.ready), self._warm[0])
                self._warm.remove(child)
            else:
                child = self.spawn()
            self._taken.add(child)
        self.refill()
        child.wait_ready(self.timeout_s)
        return child

    def wait_ready(self, timeout_s: float) -> bool:
        """Block until every pooled child has warmed up (benchmarks measure a warm worker)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if len(self._warm) >= self.size and all(c.ready for c in self._warm):
                    return True
            time.sleep(0.1)
        return False

    def close(self) -> None:
        """End the warm children and those still running a job, whose jobs then fail: for a process
        that is stopping (children run in their own sessions, so a Ctrl-C does not reach them)."""
        with self._lock:  # closed first, so no child starts after the ones killed below
            self._closed = True
            self._spawner.shutdown(wait=False)
            while self._warm:
                self._warm.popleft().discard()
            running = list(self._taken)
        for child in running:
            child.process.kill()

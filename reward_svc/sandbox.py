"""Evaluation children: sandbox policy, a warm pool, and the files each child may see.

Layout under ``<data_dir>/reward`` (``jobs/`` and ``exchange/`` under ``KZ_REWARD_SCRATCH_DIR`` when set):
  jobs/<owner>-<id>/  one child's private, writable work directory (owner: the worker that started
                    it, pid and start time; a dead worker's dirs are swept when the next one
                    creates the layout)
  jobs/<owner>-<id>.in/  the child's inbox, bound read-only: the worker hard-links into it the
                    inputs of the group its job belongs to, once the job is known
  exchange/<id>/    a reference run's inputs, published by the worker after the child exits
                    (children never see it: each gets its group's files in its inbox; the expected
                    outputs never leave jobs/)
  cache/<sha>/      compiled artefacts of one candidate source, published by the worker after a
                    clean run (only the artefact kinds the harness builds: build_cache.py); capped,
                    least recently used evicted first
  cache/.inbox/<owner>-<id>/  the child's build inbox, bound read-only: the published build of
                    the source it evaluates, hard-linked in once known; no child sees another's
  cache/triton-base Triton's driver stubs and warm-up kernel, built once per worker by a child
                    that runs only our own code; read-only to children (harness/triton_cache.py)
  locks/            one lock file per GPU: shared by correctness work, exclusive while timing;
                    children never see it: each holds two read-only descriptors its pool opened
                    (harness/loading.DeviceLock)
"""

from __future__ import annotations

import collections
import json
import os
import secrets
import shutil
import sys
import threading
import time
import uuid
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from services.config import Settings
from services.sandbox import SandboxPolicy, SandboxProcess, SandboxResult
from reward_svc.build_cache import link_tree, publish_dir
from reward_svc.harness.loading import DeviceLock
from reward_svc.harness.report import AUDIT_LOG, KEY_FIELD, RESULT_FILE, read_result


REWARD_CHILD = "reward_svc.harness.child"
MAX_RESULT_BYTES = 64 << 20  # a child's result.json; a larger one is no result (it would be read into the worker)
MAX_AUDIT_BYTES = 64 << 10


@dataclass(frozen=True)
class Layout:
    root: Path
    shared_locks: Path | None = None  # another layout's locks/: the Proposer's children lock the reward service's GPUs
    scratch: Path | None = None  # where jobs/ and exchange/ go instead of root (a tmpfs: trial tensors are GBs)

    @property
    def jobs(self) -> Path:
        return (self.scratch or self.root) / "jobs"

    @property
    def exchange(self) -> Path:
        return (self.scratch or self.root) / "exchange"

    @property
    def cache(self) -> Path:
        return self.root / "cache"

    @property
    def locks(self) -> Path:
        return self.shared_locks or self.root / "locks"

    @property
    def build_inboxes(self) -> Path:
        return self.cache / ".inbox"

    def gpu_lock(self, device: str) -> str | None:
        """The device lock file GPU work takes (harness/loading.py); none on CPU."""
        return str(self.locks / "gpu.lock") if device == "cuda" else None

    def create(self) -> Layout:
        for path in (self.jobs, self.exchange, self.cache, self.build_inboxes, self.locks):
            path.mkdir(parents=True, exist_ok=True)
        self.sweep_orphans()
        return self

    def sweep_orphans(self) -> None:
        """Remove work, inbox and exchange dirs whose owning process is gone: a worker killed mid-job
        would otherwise leave GBs of trial tensors in the scratch dir (a tmpfs: memory) for good.
        The owner is a pid and that process's start time: a restarted container's worker has the
        dead one's pid (1, often) but not its start time."""
        for path in [*self.jobs.iterdir(), *self.exchange.iterdir(), *self.build_inboxes.iterdir()]:
            if not _owner_alive(path.name.split("-", 1)[0]):
                shutil.rmtree(path, ignore_errors=True)


def owner_tag() -> str:
    """This process as the owner of the dirs it makes: ``<pid>.<start time in centiseconds>``."""
    return f"{os.getpid()}.{_start_ticks(os.getpid())}"


def _start_ticks(pid: int) -> int:
    return round(psutil.Process(pid).create_time() * 100)


def _owner_alive(tag: str) -> bool:
    pid, _, ticks = tag.partition(".")
    if not (pid.isdigit() and ticks.isdigit()):
        return False
    try:
        return _start_ticks(int(pid)) == int(ticks)
    except psutil.Error:  # no such process (any more)
        return False


class PoolClosed(RuntimeError):
    """A child was asked of a pool that was closed."""


FORGED_RESULT = {"status": "rejected", "guard": "harness_tampering",
                 "reason": "the child's result is not the one its harness wrote (the signature does not match)"}


@dataclass(eq=False)  # a child is itself: pools hold and remove it by identity
class Child:
    process: SandboxProcess
    workdir: Path
    inbox: Path | None = None  # read-only to the child: its group's inputs, linked in when the job is known
    build_inbox: Path | None = None  # read-only to the child: the published build of its source
    device_lock: DeviceLock | None = None  # the descriptors the child holds (the worker closed its copies)
    audit: str = ""  # what the child's audit hook refused, a line each (the reward harness's candidates write it)

    def run(self, spec: dict[str, Any], max_result_bytes: int = MAX_RESULT_BYTES) -> tuple[SandboxResult, dict[str, Any] | None]:
        """Run the job; the result the child wrote, or None. The spec is given the child's device lock,
        and a key the harness signs its result with (harness/report.py): a result file written by
        anything else in the child (native code) does not verify and reads as ``FORGED_RESULT``.
        The audit log is made here and read back through this process's own descriptor
        (``audit``): the child's harness appends to the same file, whatever its work dir's name for
        it becomes (renamed away, replaced by a link or a FIFO)."""
        key = secrets.token_hex(32)
        spec = {**spec, KEY_FIELD: key, "gpu_lock": self.device_lock.to_json() if self.device_lock else None}
        log = os.open(self.workdir / AUDIT_LOG, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            outcome = self.process.run((json.dumps(spec) + "\n").encode())
            self.audit = os.pread(log, MAX_AUDIT_BYTES, 0).decode(errors="replace")
        finally:
            os.close(log)
        result = read_result(self.workdir / RESULT_FILE, key, max_result_bytes)
        return outcome, dict(FORGED_RESULT) if result is False else result

    @property
    def ready(self) -> bool:
        return (self.workdir / "ready").exists()

    def receive(self, exchange: Path | None = None, build: Path | None = None) -> None:
        """Link a group's input files and a source's published build into the child's read-only inboxes."""
        if exchange is not None and self.inbox is not None:
            link_tree(exchange, self.inbox)
        if build is not None and self.build_inbox is not None:
            link_tree(build, self.build_inbox)

    def discard(self) -> None:
        self.process.kill()
        for path in (self.workdir, self.inbox, self.build_inbox):
            if path is not None:
                shutil.rmtree(path, ignore_errors=True)


class ChildPool:
    """Keeps ``size`` children warm (torch imported, CUDA initialised, blocked on stdin).

    ``entry`` is the child's module (``python -m ENTRY WORKDIR DEVICE``): the reward harness by
    default; the Proposer's validation child reuses the pool with its own.
    """

    def __init__(self, settings: Settings, layout: Layout, device: str, timeout_s: float, size: int,
                 entry: str = REWARD_CHILD) -> None:
        self.settings, self.layout, self.device, self.timeout_s, self.size = settings, layout, device, timeout_s, size
        self.entry = entry
        self._warm: collections.deque[Child] = collections.deque()
        self._taken: weakref.WeakSet[Child] = weakref.WeakSet()  # running a job now: close() stops them too
        self._closed = False
        self._lock = threading.Lock()
        # bwrap's --die-with-parent follows the *thread* that started a child: every child is
        # started from this one long-lived thread, so a warm child outlives the job thread that
        # asked for it.
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kz-child-spawner")
        if device == "cuda" and entry == REWARD_CHILD:
            self._prime_triton_base()
        self.refill()

    @property
    def triton_base(self) -> Path:
        return self.layout.cache / "triton-base"

    def _prime_triton_base(self) -> None:
        """Build Triton's stubs once in a child that runs nothing but our warm-up, then share them."""
        if self.triton_base.exists():
            return
        child = self._spawn()
        try:
            _, result = child.run({"role": "prime"})
            if result and result.get("status") == "ok" and (child.workdir / "triton").is_dir():
                publish_dir(child.workdir / "triton", self.triton_base)  # False: another worker published it first
        finally:
            child.discard()

    def policy(self, workdir: Path, inbox: Path | None = None, build_inbox: Path | None = None) -> SandboxPolicy:
        env = {
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
            "TRITON_CACHE_DIR": str(workdir / "triton"),
            # harness/triton_cache.py (named here, not imported: that module imports triton)
            "TRITON_CACHE_MANAGER": "reward_svc.harness.triton_cache:LayeredCacheManager",
            "KZ_TRITON_LAYERS": str(self.triton_base) if self.triton_base.is_dir() else "",
            "TORCH_EXTENSIONS_DIR": str(workdir / "torch_extensions"),
            "OMP_NUM_THREADS": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        if self.device == "cpu":
            env["TRITON_INTERPRET"] = "1"
        for name in ("CUDA_VISIBLE_DEVICES", "CUDA_HOME", "LD_LIBRARY_PATH"):
            if name in os.environ:
                env[name] = os.environ[name]
        return SandboxPolicy(
            wall_timeout_s=self.timeout_s,
            memory_bytes=None if self.device == "cuda" else self.settings.sandbox_memory_bytes,
            max_file_bytes=self.settings.reward_max_file_bytes,
            writable_dirs=(workdir,),
            # its own inboxes and the base Triton layer, never another child's files or the locks
            readonly_dirs=tuple(p for p in (inbox, build_inbox, self.triton_base) if p is not None and p.is_dir()),
            hidden_dirs=tuple(filter(None, (self.settings.data_dir, self.layout.scratch))),  # other jobs' files
            env=env,
            gpu=self.device == "cuda",
        )

    def _spawn(self) -> Child:
        return self._spawner.submit(self._spawn_here).result()

    def _spawn_here(self) -> Child:
        name = f"{owner_tag()}-{uuid.uuid4().hex}"  # the owner: see Layout.sweep_orphans
        workdir, inbox, build_inbox = self.layout.jobs / name, self.layout.jobs / f"{name}.in", self.layout.build_inboxes / name
        for path in (workdir, inbox, build_inbox):
            path.mkdir(parents=True)
        argv = [sys.executable, "-m", self.entry, str(workdir), self.device]
        lock_path = self.layout.gpu_lock(self.device)
        lock = DeviceLock.open(lock_path) if lock_path else None
        try:
            process = SandboxProcess(argv, self.policy(workdir, inbox, build_inbox), cwd=workdir,
                                     pass_fds=(lock.lock_fd, lock.gate_fd) if lock else ())
        finally:
            if lock:
                lock.close()  # the child holds its own copies, at the same numbers
        return Child(process, workdir, inbox, build_inbox, lock)

    def refill(self) -> None:
        with self._lock:
            while len(self._warm) < self.size and not self._closed:
                self._warm.append(self._spawn())

    def take(self) -> Child:
        """A live child, one that finished warming up if any has."""
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
                child = self._spawn()
            self._taken.add(child)
        self.refill()
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

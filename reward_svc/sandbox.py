"""Evaluation children: sandbox policy, a warm pool, and the files each child may see.

Layout under ``<data_dir>/reward`` (``jobs/`` and ``exchange/`` under ``KZ_REWARD_SCRATCH_DIR`` when set):
  jobs/<owner>-<id>/  one child's private, writable work directory (owner: the worker that started
                    it, pid and start time; a dead worker's dirs are swept when the next one
                    creates the layout)
  exchange/<id>/    a reference run's inputs, published by the worker after the child exits
                    (read-only to every candidate child; the expected outputs never leave jobs/)
  cache/<sha>/      compiled artefacts of one candidate source, published by the worker after a
                    clean run; read-only to children, so no candidate can poison another's cache;
                    capped, least recently used evicted first (build_cache.py)
  cache/triton-base Triton's driver stubs and warm-up kernel, built once per worker by a child
                    that runs only our own code; read-only to children (harness/triton_cache.py)
  locks/            one lock file per GPU: shared by correctness work, exclusive while timing
"""

from __future__ import annotations

import collections
import json
import os
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
from reward_svc.build_cache import publish_dir


REWARD_CHILD = "reward_svc.harness.child"
MAX_RESULT_BYTES = 64 << 20  # a child's result.json; a larger one is no result (it would be read into the worker)


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

    def gpu_lock(self, device: str) -> str | None:
        """The device lock file children take around GPU work (harness/loading.py); none on CPU."""
        return str(self.locks / "gpu.lock") if device == "cuda" else None

    def create(self) -> Layout:
        for path in (self.jobs, self.exchange, self.cache, self.locks):
            path.mkdir(parents=True, exist_ok=True)
        self.sweep_orphans()
        return self

    def sweep_orphans(self) -> None:
        """Remove work and exchange dirs whose owning process is gone: a worker killed mid-job
        would otherwise leave GBs of trial tensors in the scratch dir (a tmpfs: memory) for good.
        The owner is a pid and that process's start time: a restarted container's worker has the
        dead one's pid (1, often) but not its start time."""
        for path in [*self.jobs.iterdir(), *self.exchange.iterdir()]:
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


@dataclass(eq=False)  # a child is itself: pools hold and remove it by identity
class Child:
    process: SandboxProcess
    workdir: Path

    def run(self, spec: dict[str, Any], max_result_bytes: int = MAX_RESULT_BYTES) -> tuple[SandboxResult, dict[str, Any] | None]:
        outcome = self.process.run((json.dumps(spec) + "\n").encode())
        path = self.workdir / "result.json"
        try:  # written by a process that ran untrusted code: anything but a small JSON object is no result
            if path.stat().st_size > max_result_bytes:
                return outcome, None
            result = json.loads(path.read_text())
        except (OSError, ValueError, RecursionError):
            return outcome, None
        return outcome, result if isinstance(result, dict) else None

    @property
    def ready(self) -> bool:
        return (self.workdir / "ready").exists()

    def discard(self) -> None:
        self.process.kill()
        shutil.rmtree(self.workdir, ignore_errors=True)


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

    def policy(self, workdir: Path) -> SandboxPolicy:
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
            writable_dirs=(workdir, self.layout.locks),
            readonly_dirs=(self.layout.exchange, self.layout.cache),
            hidden_dirs=tuple(filter(None, (self.settings.data_dir, self.layout.scratch))),  # other jobs' files
            env=env,
            gpu=self.device == "cuda",
        )

    def _spawn(self) -> Child:
        return self._spawner.submit(self._spawn_here).result()

    def _spawn_here(self) -> Child:
        workdir = self.layout.jobs / f"{owner_tag()}-{uuid.uuid4().hex}"  # the owner: see Layout.sweep_orphans
        workdir.mkdir(parents=True)
        argv = [sys.executable, "-m", self.entry, str(workdir), self.device]
        return Child(SandboxProcess(argv, self.policy(workdir), cwd=workdir), workdir)

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

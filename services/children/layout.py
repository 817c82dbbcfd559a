"""Where sandboxed children's files live, and who owns them.

Layout under its root (the reward service's: ``<data_dir>/reward``; ``jobs/`` and ``exchange/`` under
``KZ_REWARD_SCRATCH_DIR`` when set):
  jobs/<owner>-<id>/  one child's private, writable work directory (owner: the worker that started
                    it, pid and start time; a dead worker's dirs are swept when the next one
                    creates the layout)
  jobs/<owner>-<id>.in/  the child's inbox, bound read-only: the worker hard-links into it the
                    inputs of the group its job belongs to, once the job is known
  exchange/<id>/    a reference run's inputs, published by the worker after the child exits
                    (children never see it: each gets its group's files in its inbox; the expected
                    outputs never leave jobs/)
  cache/<sha>/      compiled artefacts of one candidate source, published by the worker after a
                    clean run (only the artefact kinds the harness builds: reward_svc/build_cache.py); capped,
                    least recently used evicted first
  cache/.inbox/<owner>-<id>/  the child's build inbox, bound read-only: the published build of
                    the source it evaluates, hard-linked in once known; no child sees another's
  cache/triton-base Triton's driver stubs and warm-up kernel, built once per worker by a child
                    that runs only our own code; read-only to children (reward_svc/harness/triton_cache.py)
  cache/precompiled-headers-<torch>  precompiled headers of what every load_inline bindings unit and
                    CUDA unit's host code start with, built the same way (reward_svc/shared_builds.py); read-only to children
  locks/            one lock file per GPU: shared by correctness work, exclusive while timing, and
                    its timings file (timings announce themselves there, and go in batches);
                    children never see them: each holds two read-only descriptors its pool opened
                    (``device.DeviceLock``)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import psutil

from services.children.files import remove_tree


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
        """The device lock file GPU work takes (``device.gpu_lock``); none on CPU."""
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
                remove_tree(path)


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

"""Published builds of candidate sources, ``cache/<sha256 of the source>``: find, publish, evict.

The worker publishes a child's build after a clean run, and only what the harness builds there:
regular files of the artefact kinds its compile paths write (``ARTEFACT_SUFFIXES``: shared objects,
objects and their sources and metadata from reward_svc/compile.py; Triton's compiled kernels and
their metadata), within ``MAX_ARTEFACT_BYTES`` each and ``MAX_BUILD_BYTES`` in all; anything else
the child left there (links, FIFOs, other files, junk) is dropped. A child never sees the cache: its
own source's build is hard-linked into its read-only inbox (sandbox.py), so no candidate reads or
poisons another's binaries. The cache is capped (``KZ_REWARD_CACHE_MAX_BYTES``): least recently
used builds go first, but never one used within ``in_use_s``, since a running child may be loading
it. ``triton-base`` and ``precompiled-headers-*`` (reward_svc/shared_builds.py) are never evicted.
"""

from __future__ import annotations

import os
import shutil
import stat
import threading
import time
import uuid
from pathlib import Path

from reward_svc.shared_builds import PRECOMPILED_HEADERS_PREFIX  # one per torch
from services.children.files import publish_dir
from services.db.tasks import source_sha256

PROTECTED = frozenset({"triton-base", ".inbox"})
ARTEFACT_SUFFIXES = frozenset(
    {
        ".so",
        ".o",
        ".json",
        ".cpp",
        ".cu",
        ".h",
        ".cuh",  # reward_svc/compile.py: the library, its units, meta.json
        ".cubin",
        ".ptx",
        ".ttir",
        ".ttgir",
        ".llir",
        ".source",
        ".hsaco",
        ".amdgcn",  # Triton's cache entries
    }
)
MAX_ARTEFACT_BYTES = 256 << 20
MAX_BUILD_BYTES = 512 << 20
MAX_DEPTH = 4


class BuildCache:
    def __init__(self, root: Path, max_bytes: int, *, in_use_s: float = 3600.0, check_every_s: float = 60.0) -> None:
        self.root, self.max_bytes, self.in_use_s, self.check_every_s = root, max_bytes, in_use_s, check_every_s
        self._lock = threading.Lock()
        self._last_check = 0.0

    def path_for(self, source: str) -> Path:
        return self.root / source_sha256(source)

    def lookup(self, source: str) -> Path | None:
        """The source's published build, marked as just used; None if there is none."""
        path = self.path_for(source)
        try:
            os.utime(path)
        except OSError:
            return None
        return path

    def publish(self, build: Path, source: str) -> None:
        """Copy the artefacts of a child's build in (``artefacts``); a concurrent publisher of the same
        source wins. Then keep the cap."""
        staging = self.root.parent / f".staging-{uuid.uuid4().hex}"
        try:
            if not copy_artefacts(build, staging):
                return
            if publish_dir(staging, self.path_for(source)) and time.monotonic() - self._last_check >= self.check_every_s:
                self.evict()
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def evict(self) -> list[str]:
        """Remove least recently used builds until the cache is within its cap; returns their names."""
        with self._lock:
            self._last_check = time.monotonic()
            entries = [
                (p.stat().st_mtime, _size(p), p)
                for p in self.root.iterdir()
                if p.name not in PROTECTED and not p.name.startswith(PRECOMPILED_HEADERS_PREFIX) and p.is_dir()
            ]
            total = sum(size for _, size, _ in entries)
            evicted: list[str] = []
            cutoff = time.time() - self.in_use_s
            for mtime, size, path in sorted(entries, key=lambda e: e[0]):
                if total <= self.max_bytes or mtime > cutoff:
                    break
                doomed = self.root.parent / f".evicted-{uuid.uuid4().hex}"  # out of sight at once, then deleted
                try:
                    path.rename(doomed)
                except OSError:
                    continue
                shutil.rmtree(doomed, ignore_errors=True)
                total -= size
                evicted.append(path.name)
            return evicted


def artefacts(build: Path) -> list[Path]:
    """The files of a child's build worth keeping: regular files (not links) of an artefact suffix, at
    most ``MAX_DEPTH`` levels down and ``MAX_ARTEFACT_BYTES`` each; none if together they pass
    ``MAX_BUILD_BYTES`` (nothing the harness builds is that large)."""
    kept, total = [], 0
    for root, dirs, files in os.walk(build, followlinks=False):
        depth = len(Path(root).relative_to(build).parts)
        if depth >= MAX_DEPTH:
            dirs.clear()
        for name in files:
            path = Path(root) / name
            try:
                info = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode) and path.suffix in ARTEFACT_SUFFIXES and info.st_size <= MAX_ARTEFACT_BYTES:
                kept.append(path)
                total += info.st_size
    return kept if total <= MAX_BUILD_BYTES else []


def copy_artefacts(build: Path, target: Path) -> bool:
    """``artefacts(build)`` copied to ``target`` (made here): False where there are none."""
    kept = artefacts(build)
    if not kept:
        return False
    for path in kept:
        destination = target / path.relative_to(build)
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, destination, follow_symlinks=False)
    return True


def _size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total

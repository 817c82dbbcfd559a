"""Published builds of candidate sources, ``cache/<sha256 of the source>``: find, publish, evict.

The worker publishes a child's build after a clean run; children see the cache read-only, so no
candidate can poison another's binaries. The cache is capped (``KZ_REWARD_CACHE_MAX_BYTES``):
least recently used builds go first, but never one used within ``in_use_s``, since a running
child may be loading it. ``triton-base`` (Triton's own stubs, sandbox.py) is never evicted.
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
import time
import uuid
from pathlib import Path

from services.db.tasks import source_sha256

PROTECTED = frozenset({"triton-base"})


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
        """Move a child's build in; a concurrent publisher of the same source wins. Then keep the cap."""
        if publish_dir(build, self.path_for(source)) and time.monotonic() - self._last_check >= self.check_every_s:
            self.evict()

    def evict(self) -> list[str]:
        """Remove least recently used builds until the cache is within its cap; returns their names."""
        with self._lock:
            self._last_check = time.monotonic()
            entries = [(p.stat().st_mtime, _size(p), p) for p in self.root.iterdir() if p.name not in PROTECTED and p.is_dir()]
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


def publish_dir(source: Path, target: Path) -> bool:
    """Put ``source`` in place as ``target`` all at once, or not at all if ``target`` exists (a
    concurrent publisher won). A rename where both are on one filesystem; else (children's dirs on a
    tmpfs scratch, the cache on disk) a copy beside ``target``, renamed there."""
    try:
        source.rename(target)
        return True
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            return False
    staging = target.parent / f".publishing-{uuid.uuid4().hex}"
    try:
        shutil.copytree(source, staging, symlinks=True)
        staging.rename(target)
        return True
    except OSError:
        return False
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total

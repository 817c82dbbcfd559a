"""What the reward harness's children share read-only, built by children that run only our own code,
so that no candidate can poison it. This is what the reward pool's children need beyond what every
pooled child gets.

- ``cache/triton-base``: Triton's driver stubs and the warm-up kernel. Each child reads Triton's cache
  through ``harness/triton_cache.py`` (``TRITON_CACHE_MANAGER``): read-only layers first (its source's
  published build, then this base), and writes only to its own work dir.
- ``cache/precompiled-headers-<torch>``: GCC precompiled headers (``compile.build_precompiled_headers``)
  of what every ``load_inline`` bindings unit starts with (torch's tensor, pybind and torch's binding
  helpers: half of ``main.cpp``'s compile), and of the host code cudafe++ writes for what every CUDA
  unit starts with (torch's tensor headers: most of ``cuda.cu``'s final host compile), found by each
  build through ``$KZ_PRECOMPILED_HEADERS``. One directory per torch and Python (GCC checks a header's
  flags, not the headers behind it): after an upgrade the next worker builds its own and removes the
  others. It is built in the background (a minute of one core), so the first jobs do not wait for it:
  children started before it was published compile without it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import shutil
import sys
import threading
from pathlib import Path

import structlog

from reward_svc.compile import PRECOMPILED_HEADERS_ENV
from services.children.files import publish_dir
from services.children.layout import Layout
from services.children.pool import ChildPool, PoolClosed

HARNESS_CHILD = "reward_svc.harness.child"
PRECOMPILED_HEADERS_PREFIX = "precompiled-headers-"
PRECOMPILED_HEADERS_TIMEOUT_S = 600.0

log = structlog.get_logger(__name__)


def torch_and_python() -> str:
    """Which torch and Python this worker runs, without importing torch: what the precompiled headers are built for."""
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = "none"
    return hashlib.sha256(f"{torch_version} {sys.version}".encode()).hexdigest()[:12]


class SharedBuilds:
    """The reward harness's ``ChildExtras``."""

    def __init__(self, layout: Layout, device: str) -> None:
        self.triton_base, self.device = layout.cache / "triton-base", device
        self.precompiled_headers = layout.cache / f"{PRECOMPILED_HEADERS_PREFIX}{torch_and_python()}"

    def env(self, workdir: Path) -> dict[str, str]:
        # harness/triton_cache.py is named here, not imported: that module imports triton
        return {
            "TRITON_CACHE_MANAGER": "reward_svc.harness.triton_cache:LayeredCacheManager",
            "KZ_TRITON_LAYERS": str(self.triton_base) if self.triton_base.is_dir() else "",
            PRECOMPILED_HEADERS_ENV: str(self.precompiled_headers) if self.precompiled_headers.is_dir() else "",
        }

    def readonly_dirs(self) -> tuple[Path, ...]:
        return (self.triton_base, self.precompiled_headers)

    def prime(self, pool: ChildPool) -> None:
        """On a GPU (where load_inline builds for real), start building the precompiled headers,
        and build Triton's stubs; once per machine, the first worker to publish them wins."""
        if self.device != "cuda":
            return
        if not self.precompiled_headers.exists():
            self.remove_other_torches_headers()
            threading.Thread(target=self.build_precompiled_headers, args=(pool,), name="precompiled-headers", daemon=True).start()
        if not self.triton_base.exists():
            self._publish(pool, "prime", "triton", self.triton_base)

    def remove_other_torches_headers(self) -> list[str]:
        """The precompiled headers built for another torch or Python (an upgrade): never used again."""
        stale = [
            p for p in self.precompiled_headers.parent.glob(f"{PRECOMPILED_HEADERS_PREFIX}*") if p != self.precompiled_headers
        ]
        for path in stale:
            shutil.rmtree(path, ignore_errors=True)
        return [p.name for p in stale]

    def build_precompiled_headers(self, pool: ChildPool) -> bool:
        """Build the precompiled headers in a child of ``pool`` and publish them; False if another
        worker did first, or the build came to nothing (builds then compile without)."""
        try:
            return self._publish(
                pool, "precompiled_headers", "precompiled-headers", self.precompiled_headers, PRECOMPILED_HEADERS_TIMEOUT_S
            )
        except PoolClosed:  # the worker is stopping
            return False
        except Exception:  # a thread of its own: builds go without the header, the worker goes on
            log.exception("shared_builds.precompiled_headers_failed")
            return False

    def _publish(self, pool: ChildPool, role: str, built: str, target: Path, timeout_s: float | None = None) -> bool:
        child = pool.spawn()
        try:
            _, result = child.run({"role": role}, wall_timeout_s=timeout_s)
            if result and result.get("status") == "ok" and any((child.workdir / built).glob("*")):
                return publish_dir(child.workdir / built, target)  # False: another worker published it first
            log.warning("shared_builds.not_built", role=role, result=result)
            return False
        finally:
            child.discard()

"""Triton's compile cache for the reward harness's children, in layers no candidate can poison.

Each child reads through ``harness/triton_cache.py`` (``TRITON_CACHE_MANAGER``): read-only layers
first (its source's published build, then ``cache/triton-base``: the driver stubs and the warm-up
kernel, built once per worker by a child that ran only our own code), and writes only to its own
work dir. This is what the reward pool's children need beyond what every pooled child gets.
"""

from __future__ import annotations

from pathlib import Path

from services.children.files import publish_dir
from services.children.layout import Layout
from services.children.pool import ChildPool

HARNESS_CHILD = "reward_svc.harness.child"


class TritonLayers:
    """The reward harness's ``ChildExtras``."""

    def __init__(self, layout: Layout, device: str) -> None:
        self.base, self.device = layout.cache / "triton-base", device

    def env(self, workdir: Path) -> dict[str, str]:
        # harness/triton_cache.py is named here, not imported: that module imports triton
        return {
            "TRITON_CACHE_MANAGER": "reward_svc.harness.triton_cache:LayeredCacheManager",
            "KZ_TRITON_LAYERS": str(self.base) if self.base.is_dir() else "",
        }

    def readonly_dirs(self) -> tuple[Path, ...]:
        return (self.base,)

    def prime(self, pool: ChildPool) -> None:
        """On a GPU, build Triton's stubs once in a child that runs nothing but our warm-up, then share them."""
        if self.device != "cuda" or self.base.exists():
            return
        child = pool.spawn()
        try:
            _, result = child.run({"role": "prime"})
            if result and result.get("status") == "ok" and (child.workdir / "triton").is_dir():
                publish_dir(child.workdir / "triton", self.base)  # False: another worker published it first
        finally:
            child.discard()

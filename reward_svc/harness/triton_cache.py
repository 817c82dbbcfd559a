"""Triton's cache in a child: read-only layers the worker published, then the child's own dir.

Triton keeps compiled kernels *and* the C stubs it builds with gcc (its CUDA driver utilities,
one launcher per kernel signature) in ``TRITON_CACHE_DIR``. A child with a private, empty dir
rebuilds all of it, seconds of gcc before the first launch. A shared writable dir would let one
candidate poison another's binaries. So Triton is pointed at this manager
(``TRITON_CACHE_MANAGER``): lookups try each directory of ``KZ_TRITON_LAYERS`` first, in order,
then the child's own ``TRITON_CACHE_DIR``; writes go only to the latter. The layers are the
worker's: ``triton-base`` (built by a child that ran nothing but our warm-up kernel) and, for a
source evaluated before, that source's own published build (``cache/<sha>/triton``), which only
the same source ever reads.
"""

from __future__ import annotations

import json
import os

from triton.runtime.cache import FileCacheManager

LAYERS_ENV = "KZ_TRITON_LAYERS"


class LayeredCacheManager(FileCacheManager):
    def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
        super().__init__(key, override=override, dump=dump)
        self._layers = [os.path.join(d, key) for d in os.environ.get(LAYERS_ENV, "").split(os.pathsep) if d]

    def get_file(self, filename: str) -> str | None:
        for layer in self._layers:
            path = os.path.join(layer, filename)
            if os.path.exists(path):
                return path
        return super().get_file(filename)

    def get_group(self, filename: str) -> dict[str, str] | None:
        for layer in self._layers:
            group = _read_group(os.path.join(layer, f"__grp__{filename}"))
            if group is not None:
                return group
        return super().get_group(filename)


def _read_group(path: str) -> dict[str, str] | None:
    """A group file's members, when the file and every member exist (Triton's own rule).

    Triton records absolute paths, and a published layer has moved since it was written; the
    members always sit beside their group file, so they are looked up there.
    """
    try:
        with open(path) as f:
            members = json.load(f).get("child_paths")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(members, dict) or not all(isinstance(p, str) for p in members.values()):
        return None
    here = {name: os.path.join(os.path.dirname(path), os.path.basename(p)) for name, p in members.items()}
    return here if all(os.path.exists(p) for p in here.values()) else None

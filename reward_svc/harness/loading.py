"""Loading what a child runs: a module from a file (Triton reads its kernels' source there), the GPU lock."""

from __future__ import annotations

import fcntl
import importlib.util
import sys
import types
from pathlib import Path


def import_file(path: Path, module_name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


_held: list[object] = []


def hold_gpu_lock(path: str | None) -> None:
    """Take the device's lock until this process exits: timing is exclusive per GPU."""
    if path:
        handle = open(path, "a")  # noqa: SIM115 (held for the life of the process)
        fcntl.flock(handle, fcntl.LOCK_EX)
        _held.append(handle)

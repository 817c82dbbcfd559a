"""Loading what a child runs: a module from its file (Triton reads its kernels' source there)."""

from __future__ import annotations

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

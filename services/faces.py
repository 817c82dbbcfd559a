"""How a service package declares its face: the names other packages may import from it, each
loaded from its module on first use.

Lazily, because a service package is also where its sandboxed children start (``python -m
reward_svc.harness.child``): importing the package must not import the service's worker side
(settings, the database, Celery) into a child, nor cost its start-up.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_face(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that resolves each exported name from its module
    (``{"Evaluator": "reward_svc.evaluate"}``) when first read."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r} (its face: {', '.join(sorted(exports))})")
        return getattr(importlib.import_module(module), name)

    return __getattr__

"""A verdict: what the reward service concluded about one candidate, and the numbers behind it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Verdict:
    status: str
    reason: str
    guard: str | None = None
    max_abs_error: float | None = None
    runtime_ms: float | None = None
    ref_runtime_ms: float | None = None
    speedup: float | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def correct(self) -> bool:
        return self.status == "correct"

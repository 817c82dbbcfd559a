"""The interface both composers offer: an API set in, a KernelBench-format module out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class ProposalHints:
    """What the caller wants: a difficulty knob and size bounds the composer should respect."""

    difficulty: float = 0.5  # 0 easy (few ops, small) .. 1 hard (long chains, larger tensors)
    max_ops: int = 6
    seed: int | None = None


@dataclass(frozen=True)
class ProposedModule:
    source: str
    api_set: list[str]
    input_shapes: list[list[int]]
    origin: str  # "composer" or "llm:<model name>"
    details: dict[str, Any] = field(default_factory=dict)


class Composer(Protocol):
    name: str

    def compose(self, api_set: Sequence[str], hints: ProposalHints) -> ProposedModule:
        """A module that uses the API set (or a shape-compatible subset of it); Declined otherwise."""
        ...

"""What the Coder's generators promise: a ``KernelGenerator`` turns a KernelBench module into
candidate kernels (an LLM behind the kernel prompt, or the deterministic ``template`` generator),
each a ``KernelDraft``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from services.llm.chat import SampledTokens, Sampling

KernelBackend = Literal["cuda", "triton"]


@dataclass(frozen=True)
class KernelDraft:
    """One generated candidate. ``source`` is None when nothing usable came out; ``declined`` says why."""

    source: str | None
    raw: str
    model: str
    model_version: str | None = None
    declined: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    tokens: SampledTokens | None = None  # where the sampling asked for them (training)


class KernelGenerator(Protocol):
    name: str
    thread_safe: bool  # may ``generate`` be called from several threads at once (the eval harness asks)

    def generate(self, module_source: str, backend: KernelBackend, sampling: Sampling) -> list[KernelDraft]:
        """Up to ``sampling.n`` candidate ``ModelNew`` sources for the module."""
        ...

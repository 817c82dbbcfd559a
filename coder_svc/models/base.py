"""The interface every model backend offers, and what it returns.

A ``ChatModel`` answers chat messages (the ``openai`` and ``hf`` backends; the Proposer's LLM
composer uses it too). A ``KernelGenerator`` turns a KernelBench module into candidate kernels:
an LLM behind a prompt, or the deterministic ``template`` generator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

KernelBackend = Literal["cuda", "triton"]
Message = dict[str, str]


@dataclass(frozen=True)
class Sampling:
    n: int = 1
    temperature: float = 0.7
    top_p: float = 0.95
    max_tokens: int = 4096
    seed: int | None = None


@dataclass(frozen=True)
class Completion:
    """One sampled reply, with the served model that wrote it."""

    text: str
    model: str
    model_version: str | None = None
    finish_reason: str | None = None


class ChatModel(Protocol):
    backend: str

    def complete(self, messages: list[Message], sampling: Sampling) -> list[Completion]:
        """``sampling.n`` replies to one conversation."""
        ...

    def describe(self) -> dict[str, Any]:
        """What is being served: model name, version, adapter."""
        ...


@dataclass(frozen=True)
class KernelDraft:
    """One generated candidate. ``source`` is None when nothing usable came out; ``declined`` says why."""

    source: str | None
    raw: str
    model: str
    model_version: str | None = None
    declined: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


class KernelGenerator(Protocol):
    name: str
    thread_safe: bool  # may ``generate`` be called from several threads at once (the eval harness asks)

    def generate(self, module_source: str, backend: KernelBackend, sampling: Sampling) -> list[KernelDraft]:
        """Up to ``sampling.n`` candidate ``ModelNew`` sources for the module."""
        ...

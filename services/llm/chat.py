"""The interface every chat model backend offers (``openai``: any OpenAI-compatible endpoint such as
vLLM; ``hf``: a local Hugging Face model), and what it returns. The Coder writes kernels with one,
the Proposer's LLM composer writes modules with one, the trainer samples from one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from services.schemas.numbers import StrictFiniteFloat

Message = dict[str, str]


class Sampling(BaseModel):
    """How to sample: ``n`` replies per conversation. In a request, a field left out takes the
    service's default (``KZ_CODER_TEMPERATURE`` and friends: ``coder_svc.service.sampling_for``)."""

    model_config = ConfigDict(frozen=True)

    n: StrictInt = Field(1, ge=0, le=64, description="Replies to sample per conversation.")
    temperature: StrictFiniteFloat = Field(0.7, ge=0, le=2, description="Sampling temperature; 0 is greedy.")
    top_p: StrictFiniteFloat = Field(
        0.95, gt=0, le=1, description="Nucleus sampling: the smallest set of tokens with this much probability mass."
    )
    max_tokens: StrictInt = Field(
        4096, ge=1, le=65536, description="Longest reply in tokens; a reply cut here has finish_reason 'length'."
    )
    seed: StrictInt | None = Field(None, ge=0, lt=2**63, description="Sampler seed, for replies that repeat; None: random.")
    logprobs: bool = Field(
        False,
        description="Also return each reply's prompt text, token ids and the sampler's log-probabilities "
        "(what training needs; vLLM and the hf backend give them).",
    )


class SampledTokens(BaseModel):
    """A reply as the sampler saw it, for training: the prompt text after the chat template (None where
    the backend does not show it: the trainer renders the messages with the model's own template), the
    reply's token ids and each one's log-probability under the sampler (at its temperature)."""

    model_config = ConfigDict(frozen=True)

    prompt: str | None = Field(
        None, description="The prompt text after the chat template; None where the backend does not show it."
    )
    completion_ids: list[int] = Field(description="The reply's token ids.")
    logprobs: list[float] | None = Field(
        None, description="Each reply token's log-probability under the sampler, at its temperature; None where not given."
    )


@dataclass(frozen=True)
class Completion:
    """One sampled reply, with the served model that wrote it (and its tokens, where asked for)."""

    text: str
    model: str
    model_version: str | None = None
    finish_reason: str | None = None
    tokens: SampledTokens | None = None


class ChatModel(Protocol):
    backend: str

    def complete(self, messages: list[Message], sampling: Sampling) -> list[Completion]:
        """``sampling.n`` replies to one conversation."""
        ...

    def describe(self) -> dict[str, Any]:
        """What is being served: model name, version, adapter."""
        ...


class SwitchableChatModel(ChatModel, Protocol):
    """Both LLM backends can change what they serve at runtime (POST /v1/admin/model)."""

    def load_adapter(self, name: str, path: str) -> None: ...

    def unload_adapter(self, name: str) -> None: ...

    def use_model(self, name: str) -> None: ...

"""Kernel generators: an LLM behind the kernel prompt, or the deterministic template; and the factory.

Model libraries (transformers, peft, the template's tracer) load only when their backend is built.
"""

from __future__ import annotations

from typing import Any, Literal, cast

from coder_svc.drafts import KernelBackend, KernelDraft, KernelGenerator
from coder_svc.prompts import kernel_messages, system_prompt_for
from services.config import Settings, get_settings
from services.llm.chat import ChatModel, Sampling, SwitchableChatModel
from services.llm.extract import extract_code
from services.llm.factory import build_chat_model
from services.llm.switching import switch_chat_model

GeneratorKind = Literal["template", "openai", "hf"]


class LLMKernelGenerator:
    """Prompt → ``n`` completions → extracted ``ModelNew`` sources, one draft per completion."""

    def __init__(self, chat_model: ChatModel, settings: Settings | None = None) -> None:
        self.chat_model = chat_model
        self.settings = settings or get_settings()
        self.name = f"llm:{chat_model.backend}"
        self.thread_safe = chat_model.backend == "openai"  # an HTTP client is; a local model in this process is not
        self.loaded_adapters: list[str] = []  # oldest first: what ``switch_model`` loaded

    def generate(self, module_source: str, backend: KernelBackend, sampling: Sampling) -> list[KernelDraft]:
        messages = kernel_messages(module_source, backend, system_prompt_for(backend, self.settings))
        drafts = []
        for completion in self.chat_model.complete(messages, sampling):
            source = extract_code(completion.text)
            declined = None
            if source is None:
                declined = (
                    "the reply was cut at max_tokens before a complete program defining ModelNew"
                    if completion.finish_reason == "length"
                    else "the reply holds no Python program defining ModelNew"
                )
            drafts.append(
                KernelDraft(
                    source=source,
                    raw=completion.text,
                    model=completion.model,
                    model_version=completion.model_version,
                    declined=declined,
                    details={"generator": self.name, "prompt": messages, "finish_reason": completion.finish_reason},
                    tokens=completion.tokens,
                )
            )
        return drafts

    def describe(self) -> dict[str, Any]:
        return {"generator": self.name, **self.chat_model.describe()}


def switch_model(generator: KernelGenerator, name: str, adapter_path: str | None = None, *, keep: int | None = None) -> None:
    """Serve ``name`` from now on (``services.llm.switching``): a LoRA adapter loaded from
    ``adapter_path`` under that name, or (no path) a model or adapter the backend already serves; of
    the adapters this generator loaded, the ``keep`` latest stay loaded (``KZ_CODER_ADAPTERS_KEPT``).
    The template generator has no model."""
    if not isinstance(generator, LLMKernelGenerator):
        raise ValueError(f"generator {generator.name!r} serves no model to switch")
    chat_model = cast(SwitchableChatModel, generator.chat_model)  # both LLM backends are
    switch_chat_model(chat_model, generator.loaded_adapters, name, adapter_path, keep=keep)


def build_generator(kind: GeneratorKind | None = None, settings: Settings | None = None) -> KernelGenerator:
    """The configured kernel generator (``KZ_CODER_MODEL_BACKEND``), or the one named by ``kind``."""
    settings = settings or get_settings()
    kind = kind or settings.coder_model_backend
    if kind == "template":
        from coder_svc.template import TemplateGenerator

        return TemplateGenerator(settings)
    if kind in ("openai", "hf"):
        return LLMKernelGenerator(build_chat_model(kind, settings), settings)
    raise ValueError(f"unknown model backend {kind!r}; expected template, openai or hf")

"""The chat model the settings name (``KZ_CODER_MODEL_BACKEND``'s LLM kinds and their ``KZ_CODER_*``
endpoint, model and adapter settings). Model libraries load only when their backend is built."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from services.config import ConfigurationError, Settings, get_settings
from services.schemas.serving import ServingModel

if TYPE_CHECKING:
    from services.llm.hf_local import HFChatModel
    from services.llm.openai_chat import OpenAIChatModel

ChatKind = Literal["openai", "hf"]


def build_chat_model(kind: ChatKind, settings: Settings | None = None) -> OpenAIChatModel | HFChatModel:
    settings = settings or get_settings()
    if kind == "openai":
        from services.llm.openai_chat import OpenAIChatModel

        key = settings.coder_openai_api_key
        return OpenAIChatModel(
            settings.coder_openai_base_url,
            settings.coder_model,
            key.get_secret_value() if key else None,
            timeout_s=settings.coder_request_timeout_s,
            max_retries=settings.coder_max_retries,
            max_concurrency=settings.coder_max_concurrency,
        )
    if kind == "hf":
        if settings.coder_hf_model_path is None:
            raise ConfigurationError("the hf backend needs KZ_CODER_HF_MODEL_PATH (a local Hugging Face model directory)")
        from services.llm.hf_local import HFChatModel

        return HFChatModel(settings.coder_hf_model_path, settings.coder_lora_path)
    raise ConfigurationError(f"unknown chat model backend {kind!r}; expected openai or hf")


def configured_model(settings: Settings) -> ServingModel:
    """What the settings serve before any version is switched to (``id`` None); the template backend
    serves no model and is named ``template``."""
    configured = {"template": "template", "openai": settings.coder_model, "hf": settings.coder_hf_model_path}[
        settings.coder_model_backend
    ]
    return ServingModel(
        name=str(configured) if configured else "(the endpoint's first model)",
        backend=settings.coder_model_backend,
        adapter_path=str(settings.coder_lora_path) if settings.coder_lora_path else None,
    )

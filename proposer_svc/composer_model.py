"""The model the Proposer's llm composer writes with: the Proposer's own serving version (role
``proposer``, switched through its ``POST /v1/admin/model``), else the Coder's configured model.

A process keeps the chat model across proposal rounds and follows a switch at its next round: a
local (``hf``) model is loaded anew with the version's weights; an endpoint (``openai``) keeps its
client and loads the version's adapter at runtime, as the Coder's workers do.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import structlog

from services.config import Settings
from services.db.serving import Role, ServingVersion, serving_version
from services.llm.chat import ChatModel, SwitchableChatModel
from services.llm.factory import ChatKind, build_chat_model
from services.llm.switching import switch_chat_model

log = structlog.get_logger(__name__)

PROPOSER_ROLE: Role = "proposer"


def composer_chat_model(backend: ChatKind, settings: Settings) -> ChatModel:
    """The chat model for this round (the serving version is read now), kept by this process."""
    return composer_model_cache().get(backend, serving_version(PROPOSER_ROLE), settings)


class ComposerModelCache:
    """The llm composer's chat model, built again only when the backend, the settings or the serving
    version changed."""

    def __init__(self) -> None:
        self._model: SwitchableChatModel | None = None
        self._backend: ChatKind | None = None
        self._settings: Settings | None = None
        self._version_id: str | None = None
        self.loaded_adapters: list[str] = []  # oldest first: what the switches loaded on this model

    def get(self, backend: ChatKind, version: ServingVersion | None, settings: Settings) -> ChatModel:
        version_id = version.id if version else None
        model, same_source = self._model, (self._backend, self._settings) == (backend, settings)
        if model is not None and same_source and self._version_id == version_id:
            return model
        # an endpoint only switches to the version's adapter; a local model is loaded with the version's weights
        if model is None or not (same_source and backend == "openai" and version is not None):
            self._model = model = base_model_for(backend, version, settings)
            self.loaded_adapters = []
        if version is not None:
            keep = settings.coder_adapters_kept
            switch_chat_model(model, self.loaded_adapters, version.name, version.adapter_path, keep=keep)
            log.info("proposer.composer_model_switched", backend=backend, version=version.id, name=version.name)
        self._backend, self._settings, self._version_id = backend, settings, version_id
        return model


@lru_cache
def composer_model_cache() -> ComposerModelCache:
    """One per process: a proposer worker keeps its loaded model between rounds."""
    return ComposerModelCache()


def base_model_for(backend: ChatKind, version: ServingVersion | None, settings: Settings) -> SwitchableChatModel:
    """The configured chat model; for a local model, on the version's base weights where it names them."""
    if backend != "hf" or version is None:
        return build_chat_model(backend, settings)
    from services.llm.hf_local import HFChatModel  # model libraries load where a model is built only

    base = Path(version.base_model) if version.base_model else settings.coder_hf_model_path
    if base is None:
        raise ValueError(f"version {version.name!r} names no base model and KZ_CODER_HF_MODEL_PATH is not set")
    # whole weights serve under the version's name; an adapter gets that name when it is loaded
    return HFChatModel(base, name=None if version.adapter_path else version.name)

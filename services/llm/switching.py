"""Serving another model version on a running chat model: a LoRA adapter loaded under the version's
name and made the served model, the oldest adapters beyond a count unloaded. The Coder's generators
and the Proposer's llm composer follow their ``POST /v1/admin/model`` switches this way."""

from __future__ import annotations

import structlog

from services.llm.chat import SwitchableChatModel
from services.llm.openai_chat import ModelBackendError

log = structlog.get_logger(__name__)


def switch_chat_model(
    chat_model: SwitchableChatModel, loaded: list[str], name: str, adapter_path: str | None = None, *, keep: int | None = None
) -> None:
    """Serve ``name`` from now on: a LoRA adapter loaded from ``adapter_path`` under that name, or (no
    path) a model or adapter the backend already serves. ``loaded`` lists the adapters this caller
    loaded, oldest first, and is kept up to date: the ``keep`` latest stay loaded (the served one
    among them) and older ones are unloaded (None: all stay)."""
    if adapter_path is not None:
        chat_model.load_adapter(name, adapter_path)
        loaded[:] = [*(n for n in loaded if n != name), name]
    chat_model.use_model(name)
    while keep is not None and len(loaded) > keep:
        oldest = loaded.pop(0)
        try:
            chat_model.unload_adapter(oldest)
        except KeyError:  # not loaded here
            pass
        except ModelBackendError as exc:
            if exc.status not in (400, 404):  # not "already gone" (another worker sharing the server unloaded it)
                raise
            log.info("llm.adapter_already_unloaded", adapter=oldest, reason=str(exc)[:200])

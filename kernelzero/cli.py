"""``kernelzero``: the platform's commands (``up``, ``status``, ``apikey``, ``db``), each service's, and the
integrations' (``ci``)."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.markup import escape

import coder_svc
import proposer_svc
import reward_svc
import trainer
from integrations import ci
from services.cli.platform import app
from services.config import ConfigurationError
from services.llm.openai_chat import ModelBackendError

for install in (reward_svc.install_cli, proposer_svc.install_cli, coder_svc.install_cli, trainer.install_cli, ci.install_cli):
    install(app)


def main() -> None:
    """The ``kernelzero`` command. A configuration that cannot work (``hf`` with no model path, an
    ``openai`` endpoint that does not answer) is one line with the reason and exit 1, not a traceback."""
    try:
        app()
    except (ConfigurationError, ModelBackendError) as exc:
        Console(stderr=True).print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
        sys.exit(1)


__all__ = ["app", "main"]

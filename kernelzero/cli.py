"""``kernelzero``: the platform's commands (``up``, ``status``, ``apikey``, ``db``), each service's, and the
integrations' (``ci``)."""

from __future__ import annotations

import coder_svc
import proposer_svc
import reward_svc
import trainer
from integrations import ci
from services.cli.platform import app

for install in (reward_svc.install_cli, proposer_svc.install_cli, coder_svc.install_cli, trainer.install_cli, ci.install_cli):
    install(app)

__all__ = ["app"]

"""Proposer service: API co-occurrence, module composition, validation, the frontier reward.

Its face, what other packages may import (loaded on first use: see ``services.faces``):
``propose`` (compose, validate and store a round of modules), ``validate_modules`` and
``ValidationOptions`` (the checks a task must pass, in sandboxed children), ``frontier_reward`` and
``FrontierConfig`` (the reward for a module the Coder solves about half the time), ``install_cli``.
"""

from typing import TYPE_CHECKING

from services.faces import lazy_face

if TYPE_CHECKING:
    from proposer_svc.cli import install_cli
    from proposer_svc.frontier import FrontierConfig, frontier_reward
    from proposer_svc.service import propose
    from proposer_svc.validate import ValidationOptions, validate_modules

__all__ = ["FrontierConfig", "ValidationOptions", "frontier_reward", "install_cli", "propose", "validate_modules"]
__getattr__ = lazy_face(
    __name__,
    {
        "FrontierConfig": "proposer_svc.frontier",
        "ValidationOptions": "proposer_svc.validate",
        "frontier_reward": "proposer_svc.frontier",
        "install_cli": "proposer_svc.cli",
        "propose": "proposer_svc.service",
        "validate_modules": "proposer_svc.validate",
    },
)

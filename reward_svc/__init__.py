"""Reward service: sandboxed compile, verify and benchmark of untrusted kernels; CA-GRPO rewards.

Its face, what other packages may import (loaded on first use: see ``services.faces``):
``Evaluator`` and ``Evaluation`` (evaluate groups of candidates against a reference in sandboxed
children), ``score_group`` (that, with each verdict's CA-GRPO reward), ``group_rewards``,
``check_source`` and ``check_tree`` (the capability policy on a source), ``install_cli``. Verdicts,
options and the reward config are schemas: ``services.schemas.reward``.
"""

from typing import TYPE_CHECKING

from services.faces import lazy_face

if TYPE_CHECKING:
    from reward_svc.cli import install_cli
    from reward_svc.evaluate import Evaluation, Evaluator
    from reward_svc.policy import check_source, check_tree
    from reward_svc.rewards import group_advantages, group_rewards
    from reward_svc.service import score_group

__all__ = [
    "Evaluation",
    "Evaluator",
    "check_source",
    "check_tree",
    "group_advantages",
    "group_rewards",
    "install_cli",
    "score_group",
]
__getattr__ = lazy_face(
    __name__,
    {
        "Evaluation": "reward_svc.evaluate",
        "Evaluator": "reward_svc.evaluate",
        "check_source": "reward_svc.policy",
        "check_tree": "reward_svc.policy",
        "group_advantages": "reward_svc.rewards",
        "group_rewards": "reward_svc.rewards",
        "install_cli": "reward_svc.cli",
        "score_group": "reward_svc.service",
    },
)

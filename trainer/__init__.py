"""Trainer: rollout intake, CA-GRPO for the Coder (cold-start SFT, Proposer RL and the alternating
loop are still to come).

Its face, what other packages may import (loaded on first use: see ``services.faces``):
``record_coder_job`` (a training generation job's candidates as one rollout group), ``record_group``
and ``Sample`` (write one scored group of samples for training), ``claim_groups``
(take whole groups once, with the reasons others were dropped), ``CoderRLConfig``/``LoRAConfig``
and ``load_config`` (a run's typed configuration), ``CoderTrainer`` (one CA-GRPO step on claimed
groups, and saving what it trained).
"""

from typing import TYPE_CHECKING

from services.faces import lazy_face

if TYPE_CHECKING:
    from trainer.coder_rl import CoderTrainer
    from trainer.config import CoderRLConfig, LoRAConfig, load_config
    from trainer.intake import record_coder_job
    from trainer.rollouts import Sample, claim_groups, record_group

__all__ = [
    "CoderRLConfig",
    "CoderTrainer",
    "LoRAConfig",
    "Sample",
    "claim_groups",
    "load_config",
    "record_coder_job",
    "record_group",
]
__getattr__ = lazy_face(
    __name__,
    {
        "CoderRLConfig": "trainer.config",
        "CoderTrainer": "trainer.coder_rl",
        "LoRAConfig": "trainer.config",
        "Sample": "trainer.rollouts",
        "claim_groups": "trainer.rollouts",
        "load_config": "trainer.config",
        "record_coder_job": "trainer.intake",
        "record_group": "trainer.rollouts",
    },
)

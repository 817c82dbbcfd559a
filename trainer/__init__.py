"""Trainer: rollout intake, cold-start SFT, CA-GRPO for the Coder and GRPO for the Proposer, weight
publishing, and the alternating loop's runs.

Its face, what other packages may import (loaded on first use: see ``services.faces``):
``record_coder_job`` (a training generation job's candidates as one rollout group), ``record_group``
and ``Sample`` (write one scored group of samples for training), ``claim_groups``
(take whole groups once, with the reasons others were dropped), ``CoderRLConfig``/``ProposerRLConfig``/``LoRAConfig``
and ``load_config`` (a run's typed configuration), ``PolicyTrainer`` (one policy step on claimed
groups, the Coder's or the Proposer's, and saving what it trained), ``publish_version`` (a trained version saved and served),
``LoopConfig`` and ``submit_run`` (a run of the loop, a round per job), ``install_cli`` (``kernelzero train``).
"""

from typing import TYPE_CHECKING

from services.faces import lazy_face

if TYPE_CHECKING:
    from trainer.cli import install_cli
    from trainer.config import CoderRLConfig, LoopConfig, LoRAConfig, ProposerRLConfig, load_config
    from trainer.intake import record_coder_job
    from trainer.policy import PolicyTrainer
    from trainer.publish import publish_version
    from trainer.rollouts import Sample, claim_groups, record_group
    from trainer.runs import submit_run

__all__ = [
    "CoderRLConfig",
    "PolicyTrainer",
    "ProposerRLConfig",
    "LoRAConfig",
    "LoopConfig",
    "Sample",
    "claim_groups",
    "install_cli",
    "load_config",
    "publish_version",
    "record_coder_job",
    "record_group",
    "submit_run",
]
__getattr__ = lazy_face(
    __name__,
    {
        "CoderRLConfig": "trainer.config",
        "PolicyTrainer": "trainer.policy",
        "ProposerRLConfig": "trainer.config",
        "LoRAConfig": "trainer.config",
        "LoopConfig": "trainer.config",
        "Sample": "trainer.rollouts",
        "claim_groups": "trainer.rollouts",
        "install_cli": "trainer.cli",
        "load_config": "trainer.config",
        "publish_version": "trainer.publish",
        "record_coder_job": "trainer.intake",
        "record_group": "trainer.rollouts",
        "submit_run": "trainer.runs",
    },
)

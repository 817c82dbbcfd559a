"""One CA-GRPO step's gradients, run as ``torchrun --nproc_per_node N tests/distributed_step.py MODEL OUT``
(with ``ACCELERATE_USE_CPU=true``): every process takes its share of one fixed set of groups (uneven completion lengths, so
the processes hold different token counts), accumulates, and the main process saves the gradients
and the step's loss to OUT (``torch.save``)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from reward_svc import group_advantages
from trainer.config import CoderRLConfig
from trainer.policy import PolicyTrainer
from trainer.rollouts import ClaimedGroup, ClaimedSample

PROMPT = "<|user|>\nwrite a kernel<|end|>\n<|assistant|>\n"
GROUPS, GROUP_SIZE = 4, 4


def fixed_groups() -> list[ClaimedGroup]:
    generator = torch.Generator().manual_seed(7)
    groups = []
    for g in range(GROUPS):
        completions = [
            torch.randint(5, 300, (int(torch.randint(2, 12, (1,), generator=generator)),), generator=generator).tolist()
            for _ in range(GROUP_SIZE)
        ]
        rewards = torch.rand(GROUP_SIZE, generator=generator).tolist()
        samples = [
            ClaimedSample(PROMPT * (g + 1), "", c, None, r, a) for c, r, a in zip(completions, rewards, group_advantages(rewards))
        ]
        groups.append(ClaimedGroup(id=str(g), model_version_id=None, samples=samples))
    return groups


def main(model: str, out: str) -> None:
    config = CoderRLConfig(
        model_path=Path(model), lora=None, group_size=GROUP_SIZE, groups_per_step=GROUPS, micro_batch_size=3, bf16=False, seed=0
    )
    trainer = PolicyTrainer(config, total_steps=1)
    rank, world = trainer.accelerator.process_index, trainer.accelerator.num_processes
    report = trainer.accumulate(fixed_groups()[rank::world])
    if trainer.accelerator.is_main_process:
        model_ = trainer.accelerator.unwrap_model(trainer.model)
        grads = {name: p.grad.detach().clone() for name, p in model_.named_parameters() if p.grad is not None}
        torch.save({"grads": grads, "loss": report.loss, "processes": world}, out)
    trainer.accelerator.wait_for_everyone()


if __name__ == "__main__":
    main(*sys.argv[1:3])

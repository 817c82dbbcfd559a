"""CA-GRPO learns: a tiny model on a task whose reward it can raise (write tokens from a set that starts
at about an eighth of what it samples) raises its mean reward over a few CPU steps, sampling from the
policy being trained, as the loop will. A wrong sign or normalisation of the loss fails it."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import torch

from reward_svc import group_advantages
from trainer.config import CoderRLConfig
from trainer.policy import OPTIMIZER_FILE, PolicyTrainer
from trainer.rollouts import ClaimedGroup, ClaimedSample
from trainer.tiny_model import build_tiny_lm

PROMPTS = ["<|user|>\nwrite a kernel<|end|>\n<|assistant|>\n", "<|user|>\nfuse two ops<|end|>\n<|assistant|>\n"]
GROUP, LENGTH, STEPS = 8, 6, 14
TARGET = range(10, 60)  # token ids the reward pays for


def sample_groups(trainer: PolicyTrainer, generator: torch.Generator) -> list[ClaimedGroup]:
    model = trainer.accelerator.unwrap_model(trainer.model).eval()
    groups = []
    for prompt in PROMPTS:
        prompt_ids = trainer.tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        ids = prompt_ids.repeat(GROUP, 1)
        with torch.no_grad():
            for _ in range(LENGTH):  # plain ancestral sampling at temperature 1: the distribution the loss assumes
                logits = model(input_ids=ids).logits[:, -1, :]
                ids = torch.cat([ids, torch.multinomial(logits.softmax(-1), 1, generator=generator)], dim=1)
        completions = ids[:, prompt_ids.shape[1] :].tolist()
        rewards = [sum(t in TARGET for t in c) / LENGTH for c in completions]
        samples = [ClaimedSample(prompt, "", c, None, r, a) for c, r, a in zip(completions, rewards, group_advantages(rewards))]
        groups.append(ClaimedGroup(id=prompt, model_version_id=None, samples=samples))
    return groups


@pytest.mark.slow
def test_the_mean_reward_rises_over_a_few_steps(tmp_path: Path) -> None:
    model = build_tiny_lm(tmp_path / "tiny")
    config = CoderRLConfig(
        model_path=model,
        lora=None,
        learning_rate=2e-2,
        group_size=GROUP,
        groups_per_step=len(PROMPTS),
        micro_batch_size=8,
        bf16=False,
        seed=0,
    )
    trainer = PolicyTrainer(config, total_steps=STEPS)
    generator = torch.Generator().manual_seed(0)
    means = []
    for _ in range(STEPS):
        groups = sample_groups(trainer, generator)
        report = trainer.step(groups)
        means.append(report.reward_mean)
        assert report.tokens == len(PROMPTS) * GROUP * LENGTH and report.samples == len(PROMPTS) * GROUP
    early, late = statistics.fmean(means[:3]), statistics.fmean(means[-3:])
    assert late > early + 0.25, means
    assert trainer.save(tmp_path / "out").joinpath("config.json").is_file()


@pytest.mark.slow
def test_a_round_goes_on_with_the_moments_the_last_version_saved(tmp_path: Path) -> None:
    """A published version holds the optimizer's moments beside its weights (serving ignores them): the
    next round's trainer starts from them, at the learning rate its schedule has reached, not afresh."""
    model = build_tiny_lm(tmp_path / "tiny")
    config = CoderRLConfig(model_path=model, group_size=GROUP, groups_per_step=len(PROMPTS), micro_batch_size=8, bf16=False)
    first = PolicyTrainer(config, total_steps=4)
    first.step(sample_groups(first, torch.Generator().manual_seed(0)))
    saved = first.optimizer.state_dict()
    version = first.save(tmp_path / "coder-v1")
    assert (version / OPTIMIZER_FILE).is_file() and (version / "adapter_config.json").is_file()

    second = PolicyTrainer(config, total_steps=4, resume_from=version, steps_done=1)
    resumed = second.optimizer.state_dict()
    assert resumed["state"].keys() == saved["state"].keys() and saved["state"]
    for key, state in saved["state"].items():
        assert torch.equal(resumed["state"][key]["exp_avg"], state["exp_avg"])
        assert torch.equal(resumed["state"][key]["exp_avg_sq"], state["exp_avg_sq"])
    assert second.scheduler.get_last_lr() == first.scheduler.get_last_lr()
    assert second.step(sample_groups(second, torch.Generator().manual_seed(1))).samples == len(PROMPTS) * GROUP

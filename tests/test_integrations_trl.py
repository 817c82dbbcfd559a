"""TRL's GRPOTrainer scoring kernels with the reward service over real HTTP: the reward function called as
TRL calls it (keyword arguments, dataset columns, async), then a real GRPOTrainer for two steps on a tiny
model on CPU."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from datasets import Dataset

from coder_svc import kernel_messages
from integrations.trl import KernelReward, kernel_reward, prompt_key
from reward_cases import CORRECT, RELU_REFERENCE, candidate
from services.clients import RetryPolicy
from services.rl_samples import Sample, regroup
from services.schemas.reward import MAX_GROUP_CANDIDATES, ScoreOptions
from trainer.tiny_model import build_replying_lm

CPU = ScoreOptions(device="cpu")
WRONG = candidate("out = torch.empty_like(x)\nlaunch_relu(x, out)\nreturn out + 1.0")
# The same ReLU on other shapes: another reference, so another group for the same prompt text.
WIDE_RELU_REFERENCE = RELU_REFERENCE.replace("torch.randn(4, 1024)", "torch.randn(2, 4096)")


def fenced(source: str) -> str:
    return f"Here is the kernel.\n```python\n{source}\n```"


def call_as_trl(
    reward: KernelReward, prompts: list[Any], completions: list[Any], **columns: Any
) -> tuple[list[float | None], dict[str, list[float]]]:
    """``reward`` called exactly as ``GRPOTrainer._calculate_rewards`` calls an async reward function."""
    metrics: dict[str, list[float]] = {}
    extra: dict[str, list[Any]] = {}
    rewards = asyncio.run(
        reward(
            prompts=prompts,
            completions=completions,
            completion_ids=[[1, 2, 3]] * len(completions),
            **columns,
            trainer_state=None,
            log_extra=lambda column, values: extra.setdefault(column, []).extend(values),
            log_metric=lambda name, value: metrics.setdefault(name, []).append(value),
        )
    )
    assert len(extra["kernel_verdict"]) == len(completions)
    return rewards, metrics


def test_rewards_per_completion_in_trls_call_shape(reward_service: str) -> None:
    reward = kernel_reward.with_settings(url=reward_service, options=CPU)
    prompt = [{"role": "user", "content": "Write ModelNew for this module."}]
    completions = [
        [{"role": "assistant", "content": fenced(CORRECT)}],
        [{"role": "assistant", "content": fenced(WRONG)}],
        [{"role": "assistant", "content": "I cannot write this kernel."}],
        [{"role": "assistant", "content": fenced(CORRECT)}],
    ]
    references = [RELU_REFERENCE, RELU_REFERENCE, RELU_REFERENCE, WIDE_RELU_REFERENCE]
    rewards, metrics = call_as_trl(reward, [prompt] * 4, completions, reference=references, backend=["triton"] * 4)
    # correct, wrong, no program (judged: a failure), correct on the other reference
    assert rewards == [1.0, 0.0, 0.0, 1.0]
    assert metrics == {"kernel/correct": [0.5], "kernel/unscored": [0.0]}


def test_completions_regroup_by_prompt_and_reference_in_order_of_appearance() -> None:
    chat = prompt_key([{"role": "user", "content": "p"}])
    samples = [
        Sample(chat, RELU_REFERENCE, fenced(CORRECT)),
        Sample("other", RELU_REFERENCE, fenced(CORRECT)),
        Sample(chat, WIDE_RELU_REFERENCE, fenced(CORRECT)),
        Sample(chat, RELU_REFERENCE, "no code"),
        Sample("other", RELU_REFERENCE, fenced(WRONG)),
    ]
    groups = regroup(samples)
    assert [g.indices for g in groups] == [[0, 3], [1, 4], [2]]
    assert [len(g.candidates) for g in groups] == [1, 2, 1]  # the reply without a program is not sent
    with pytest.raises(ValueError, match=f"at most {MAX_GROUP_CANDIDATES}"):
        regroup([Sample("p", RELU_REFERENCE, fenced(CORRECT))] * (MAX_GROUP_CANDIDATES + 1))


def test_a_sample_the_service_could_not_score_is_none(free_port: Any) -> None:
    reward = kernel_reward.with_settings(
        url=f"http://127.0.0.1:{free_port()}", retry=RetryPolicy(max_retries=1, initial_backoff_s=0.01)
    )
    rewards, metrics = call_as_trl(reward, ["p", "p"], [fenced(CORRECT), "no code"], reference=[RELU_REFERENCE] * 2)
    assert rewards == [None, 0.0]  # nobody judged the kernel: left out; the reply without one failed on its own
    assert metrics["kernel/unscored"] == [0.5]


def test_a_dataset_without_the_reference_column_is_refused_with_the_columns_it_has(reward_service: str) -> None:
    reward = kernel_reward.with_settings(url=reward_service)
    with pytest.raises(ValueError, match=r"no 'reference' column.*\['module'\]"):
        call_as_trl(reward, ["p"], ["x"], module=[RELU_REFERENCE])


def test_grpo_trainer_trains_two_steps_on_the_services_rewards(reward_service: str, tmp_path: Path) -> None:
    from trl import GRPOConfig, GRPOTrainer

    messages = kernel_messages(RELU_REFERENCE, "triton")
    model_dir = build_replying_lm(tmp_path / "tiny-lm", messages, f"```python\n{CORRECT}\n```")
    dataset = Dataset.from_dict(
        {"prompt": [messages, messages], "reference": [RELU_REFERENCE, WIDE_RELU_REFERENCE], "backend": ["triton", "triton"]}
    )
    args = GRPOConfig(
        output_dir=str(tmp_path / "grpo"),
        per_device_train_batch_size=8,
        num_generations=4,  # two prompts × four completions per step: two groups, two /v1/score/group calls
        max_completion_length=64,
        max_steps=2,
        learning_rate=1e-3,
        logging_steps=1,
        bf16=False,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        seed=0,
    )
    seen: list[list[float | None]] = []

    class RecordingReward(KernelReward):
        async def __call__(self, *args: Any, **kwargs: Any) -> list[float | None]:
            rewards = await super().__call__(*args, **kwargs)
            seen.append(rewards)
            return rewards

    reward = RecordingReward(url=reward_service, options=CPU)
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=[reward], args=args, train_dataset=dataset)
    trainer.train()

    assert trainer.state.global_step == 2
    assert [len(batch) for batch in seen] == [8, 8]
    flat = [r for batch in seen for r in batch]
    assert set(flat) <= {0.0, 1.0} and 1.0 in flat  # scored by the service: the tiny model writes the kernel ~40% of the time
    logged = [entry for entry in trainer.state.log_history if "rewards/kernel_reward/mean" in entry]
    assert [entry["rewards/kernel_reward/mean"] for entry in logged] == pytest.approx([sum(b) / len(b) for b in seen])  # type: ignore[arg-type]
    assert all(entry["kernel/unscored"] == 0.0 for entry in logged)

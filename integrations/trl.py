"""TRL: a reward function for ``GRPOTrainer(reward_funcs=[kernel_reward])``.

TRL (``GRPOTrainer._calculate_rewards``, trl 1.x) calls every reward function with keyword arguments
only: ``prompts``, ``completions`` and ``completion_ids`` (B×G of each: every prompt repeated G times),
each dataset column by its name (one value per completion), ``trainer_state``, ``log_extra`` and
``log_metric``; an ``async`` one is awaited on TRL's own event loop; ``None`` in the answer becomes NaN,
which TRL leaves out of the group's baseline. So the dataset carries the reference module in a column
(``reference`` by default) and may carry the backend (``backend``: triton or cuda)::

    from integrations.trl import kernel_reward
    trainer = GRPOTrainer(model=..., reward_funcs=[kernel_reward], train_dataset=dataset, args=GRPOConfig(...))

Each completion's kernel is extracted from the raw text, the completions are regrouped by prompt, and
each group is scored by one ``/v1/score/group`` call; the answer is each verdict's CA-GRPO ``reward``
(``integrations.grouped_scoring`` has the rules). The share of correct kernels and of samples left
unscored go to TRL's logs as ``kernel/correct`` and ``kernel/unscored``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from integrations.grouped_scoring import Sample, ScoringSettings, score_samples
from services.schemas.reward import CAGRPOConfig, ScoreOptions


class KernelReward:
    """An async reward function for TRL's ``GRPOTrainer``; the instance's settings say where and how to score."""

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        options: ScoreOptions | None = None,
        ca_grpo: CAGRPOConfig | None = None,
        wait_s: float = 900.0,
        reference_column: str = "reference",
        backend_column: str = "backend",
        name: str = "kernel_reward",
    ) -> None:
        self.settings = ScoringSettings(url, api_key, options or ScoreOptions(), ca_grpo or CAGRPOConfig(), wait_s)
        self.reference_column = reference_column
        self.backend_column = backend_column
        self.__name__ = name  # what TRL calls the reward in its logs (rewards/<name>/mean)

    def with_settings(self, **changes: Any) -> KernelReward:
        """A copy scoring elsewhere or otherwise: ``kernel_reward.with_settings(url=..., options=...)``."""
        copy = KernelReward(reference_column=self.reference_column, backend_column=self.backend_column, name=self.__name__)
        copy.settings = replace(self.settings, **changes)
        return copy

    async def __call__(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        completion_ids: Sequence[Sequence[int]] | None = None,
        trainer_state: Any = None,
        log_extra: Callable[[str, list[Any]], None] | None = None,
        log_metric: Callable[[str, float], None] | None = None,
        **columns: Any,
    ) -> list[float | None]:
        references = columns.get(self.reference_column)
        if references is None:
            raise ValueError(
                f"the dataset has no {self.reference_column!r} column (the reference module of each prompt); "
                f"it has {sorted(columns)}"
            )
        backends = columns.get(self.backend_column) or [self.settings.options.backend] * len(completions)
        samples = [
            Sample(prompt_key(prompt), reference, completion_text(completion), backend)
            for prompt, reference, completion, backend in zip(prompts, references, completions, backends, strict=True)
        ]
        scores = await score_samples(samples, self.settings)
        if log_metric is not None and scores:
            log_metric("kernel/correct", sum(s.correct for s in scores) / len(scores))
            log_metric("kernel/unscored", sum(s.reward is None for s in scores) / len(scores))
        if log_extra is not None:
            log_extra("kernel_verdict", [s.verdict.status if s.verdict else s.reason for s in scores])
        return [s.reward for s in scores]


def prompt_key(prompt: Any) -> str:
    """A prompt as a key: its text, or its chat messages as JSON."""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)


def completion_text(completion: Any) -> str:
    """A completion's text: TRL gives a string, or (conversational datasets) the assistant's messages."""
    if isinstance(completion, str):
        return completion
    parts = [m.get("content") for m in completion if isinstance(m, dict) and m.get("role", "assistant") == "assistant"]
    return "\n".join(p for p in parts if isinstance(p, str))


kernel_reward = KernelReward()

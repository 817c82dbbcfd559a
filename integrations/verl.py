"""verl: ``compute_score`` for verl's reward managers, the reference module as the ground truth.

verl (0.9.1, read from its wheel: ``verl/workers/reward_manager/naive.py`` and ``batch.py``,
``verl/experimental/reward_loop/reward_manager/naive.py``) loads a custom reward function by file path
and name and calls it with keyword arguments only, the config's ``reward_kwargs`` merged in:

- the naive manager, per sample: ``compute_score(data_source=, solution_str=, ground_truth=, extra_info=)``,
  where ``ground_truth`` is the row's ``reward_model.ground_truth``; it reads ``score["score"]`` from a
  dict answer and keeps the other keys as ``reward_extra_info``;
- the batch manager, per batch: ``compute_score(data_sources=, solution_strs=, ground_truths=,
  extra_infos=)``, one answer per sample. ``compute_score_batch`` is that form: it regroups the batch by
  prompt and scores each group with one ``/v1/score/group`` call, as CA-GRPO needs.

In the data, put the reference module's source in ``reward_model.ground_truth`` and, optionally, the
backend in ``extra_info["backend"]`` (triton, the default, or cuda) and the prompt's row in
``extra_info["index"]``. In the config::

    reward.custom_reward_function.path=pkg://integrations.verl  reward.custom_reward_function.name=compute_score_batch
    reward.reward_manager.name=batch  +reward.custom_reward_function.reward_kwargs.url=http://reward-host:8103

verl has no way to leave a sample out of a batch, so a sample the service could not judge scores 0.0
with ``scored`` 0.0 beside it (``reward_extra_info``: its mean is the share judged); ``correct`` is 1.0
for a verified kernel. verl itself is not installed in the tests (it wants GPUs, vLLM or SGLang, Ray):
they make these two calls exactly as its managers make them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from integrations.grouped_scoring import Sample, SampleScore, ScoringSettings, score_samples_blocking
from services.clients import RetryPolicy
from services.schemas.reward import ScoreOptions


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict[str, Any] | None = None,
    **reward_kwargs: Any,
) -> dict[str, float]:
    """One sample, scored alone (a group of one): ``{"score", "correct", "scored"}``."""
    return compute_score_batch([data_source], [solution_str], [ground_truth], [extra_info], **reward_kwargs)[0]


def compute_score_batch(
    data_sources: Sequence[str],
    solution_strs: Sequence[str],
    ground_truths: Sequence[str],
    extra_infos: Sequence[dict[str, Any] | None],
    **reward_kwargs: Any,
) -> list[dict[str, float]]:
    """A batch, each prompt's samples scored as one group: one ``{"score", "correct", "scored"}`` per sample."""
    settings = scoring_settings(**reward_kwargs)
    samples = []
    for source, solution, reference, extra in zip(data_sources, solution_strs, ground_truths, extra_infos, strict=True):
        extra = extra or {}
        samples.append(
            Sample((str(source), extra.get("index")), reference, solution, extra.get("backend", settings.options.backend))
        )
    return [verl_score(score) for score in score_samples_blocking(samples, settings)]


def scoring_settings(
    url: str | None = None,
    api_key: str | None = None,
    device: str = "auto",
    backend: str = "triton",
    wait_s: float = 900.0,
    max_retries: int = 4,
    **_other: Any,  # verl passes more to some managers (reward_router_address, reward_model_tokenizer)
) -> ScoringSettings:
    """The ``reward_kwargs`` a verl config may set, as the adapters' settings."""
    options = ScoreOptions.model_validate({"device": device, "backend": backend})
    return ScoringSettings(url=url, api_key=api_key, options=options, wait_s=wait_s, retry=RetryPolicy(max_retries=max_retries))


def verl_score(score: SampleScore) -> dict[str, float]:
    return {
        "score": score.reward if score.reward is not None else 0.0,
        "correct": float(score.correct),
        "scored": float(score.reward is not None),
    }

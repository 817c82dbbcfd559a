"""verl's reward managers calling ``integrations.verl`` against a running reward service over real HTTP.
verl is not installed here (GPUs, vLLM, Ray); its calls are reproduced from verl 0.9.1's source: the
function loaded by file path (``verl.utils.import_utils.load_module``), the config's ``reward_kwargs``
merged into every call (``verl.trainer.ppo.reward._call_with_kwargs``), the naive manager's per-sample
call and the batch manager's per-batch call with its numpy ``data_sources`` and ``rollout_reward_scores``."""

from __future__ import annotations

import importlib.util
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from reward_cases import CORRECT, RELU_REFERENCE, candidate

VERL_ADAPTER = Path(__file__).resolve().parents[1] / "integrations" / "verl.py"
WRONG = candidate("out = torch.empty_like(x)\nlaunch_relu(x, out)\nreturn out + 1.0")


def load_as_verl_does(object_name: str, reward_kwargs: dict[str, Any]) -> Any:
    """``get_custom_reward_fn``: ``load_extern_object(path, name)`` wrapped in ``partial(_call_with_kwargs, ...)``."""
    spec = importlib.util.spec_from_file_location(f"custom_module_{hash(str(VERL_ADAPTER))}", VERL_ADAPTER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    raw_fn = getattr(module, object_name)

    def _call_with_kwargs(raw_fn: Any, extra_kwargs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        return raw_fn(*args, **{**kwargs, **extra_kwargs})

    return partial(_call_with_kwargs, raw_fn, reward_kwargs)


def fenced(source: str) -> str:
    return f"<think>ReLU is elementwise.</think>\n```python\n{source}\n```"


def test_naive_manager_scores_one_sample_per_call(reward_service: str) -> None:
    compute_score = load_as_verl_does("compute_score", {"url": reward_service, "device": "cpu"})
    scores = []
    for response_str in (fenced(CORRECT), fenced(WRONG), "no kernel today"):
        extra_info: dict[str, Any] = {"index": 0}
        extra_info["num_turns"] = None  # the naive manager adds these two to every extra_info
        extra_info["rollout_reward_scores"] = {}
        scores.append(
            compute_score(
                data_source="kernelbench/level1", solution_str=response_str, ground_truth=RELU_REFERENCE, extra_info=extra_info
            )
        )
    assert [s["score"] for s in scores] == [1.0, 0.0, 0.0]  # what the naive manager reads: score["score"]
    assert [s["correct"] for s in scores] == [1.0, 0.0, 0.0]
    assert [s["scored"] for s in scores] == [1.0, 1.0, 1.0]  # a reply without a kernel is judged: it failed


def test_batch_manager_scores_each_prompts_group_in_one_call(reward_service: str) -> None:
    compute_score_batch = load_as_verl_does("compute_score_batch", {"url": reward_service, "device": "cpu"})
    responses = [fenced(CORRECT), fenced(WRONG), fenced(CORRECT), fenced(CORRECT)]
    extras = [{"index": 0}, {"index": 0}, {"index": 1, "backend": "triton"}, {"index": 1, "backend": "triton"}]
    rollout_reward_scores = [{} for _ in responses]
    for i in range(len(responses)):
        extras[i]["rollout_reward_scores"] = rollout_reward_scores[i]
    scores = compute_score_batch(
        data_sources=np.array(["kernelbench"] * 4, dtype=object),
        solution_strs=responses,
        ground_truths=[RELU_REFERENCE] * 4,
        extra_infos=extras,
    )
    assert [s["score"] for s in scores] == [1.0, 0.0, 1.0, 1.0]
    assert all(s["scored"] == 1.0 for s in scores)


def test_unjudged_samples_score_zero_and_say_so(free_port: Any) -> None:
    compute_score = load_as_verl_does("compute_score", {"url": f"http://127.0.0.1:{free_port()}", "max_retries": 0})
    score = compute_score(data_source="kb", solution_str=fenced(CORRECT), ground_truth=RELU_REFERENCE, extra_info=None)
    assert score == {"score": 0.0, "correct": 0.0, "scored": 0.0}

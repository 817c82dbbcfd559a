"""KernelBench's ``eval_kernel_against_ref`` swapped for ``integrations.kernelbench``'s, called as
KernelBench's ``scripts/eval_from_generations.py`` calls it, against a running reward service over real
HTTP; and ``kernelzero eval --kernelbench-results`` writing KernelBench's ``eval_results.json``."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from integrations.kernelbench import KernelExecResult, eval_kernel_against_ref
from reward_cases import CORRECT, HACKS, RELU_REFERENCE, candidate
from services.config import Settings
from services.kernelbench import eval_results

WRONG = candidate("out = torch.empty_like(x)\nlaunch_relu(x, out)\nreturn out + 1.0")
KERNELBENCH_FIELDS = {"compiled", "correctness", "metadata", "runtime", "runtime_stats", "ref_runtime", "ref_runtime_stats"}


def as_eval_from_generations(reward_service: str, kernel_src: str) -> KernelExecResult | None:
    """The call in KernelBench's scripts/eval_from_generations.py (CPU here: the service has no GPU)."""
    return eval_kernel_against_ref(
        original_model_src=RELU_REFERENCE,
        custom_model_src=kernel_src,
        measure_performance=True,
        timing_method="cuda_event",
        verbose=False,
        num_correct_trials=3,
        num_perf_trials=100,
        build_dir=None,
        device=torch.device("cpu"),
        backend="triton",
        precision=torch.float32,
        url=reward_service,
    )


def test_verdicts_come_back_in_kernelbenchs_result_shape(reward_service: str) -> None:
    correct = as_eval_from_generations(reward_service, CORRECT)
    wrong = as_eval_from_generations(reward_service, WRONG)
    hack = as_eval_from_generations(reward_service, HACKS["kernel_never_launched"][0])
    broken = as_eval_from_generations(reward_service, "class ModelNew(:\n")
    assert correct is not None and wrong is not None and hack is not None and broken is not None
    assert set(correct.model_dump()) == KERNELBENCH_FIELDS
    assert (correct.compiled, correct.correctness) == (True, True)
    assert correct.metadata["correctness_trials"] == "(3 / 3)"
    assert (wrong.compiled, wrong.correctness) == (True, False) and "values outside" in wrong.metadata["correctness_issue"]
    # KernelBench's own harness would have passed this one (its output is right); the guard says why not
    assert (hack.compiled, hack.correctness) == (True, False) and hack.metadata["kernelzero_guard"] == "no_custom_kernel"
    assert (broken.compiled, broken.correctness) == (False, False)
    assert broken.metadata["compilation_error_name"]


def test_what_the_service_cannot_judge_is_none_and_what_it_cannot_do_is_refused(free_port: Callable[[], int]) -> None:
    assert eval_kernel_against_ref(RELU_REFERENCE, CORRECT, backend="triton", url=f"http://127.0.0.1:{free_port()}") is None
    with pytest.raises(ValueError, match="tilelang"):
        eval_kernel_against_ref(RELU_REFERENCE, CORRECT, backend="tilelang")
    with pytest.raises(ValueError, match="float16"):
        eval_kernel_against_ref(RELU_REFERENCE, CORRECT, backend="triton", precision=torch.float16)


def test_eval_results_json_is_keyed_by_problem_number_with_one_entry_per_sample() -> None:
    records: list[dict[str, Any]] = [
        {"problem": "level1/19_ReLU", "level": 1, "sample": 1, "status": "incorrect", "reason": "off by one"},
        {"problem": "level1/19_ReLU", "level": 1, "sample": 0, "status": "correct", "reason": "ok", "runtime_ms": 0.5},
        {"problem": "level1/3_Matmul", "level": 1, "sample": 0, "status": "declined", "reason": "no code"},
        {"problem": "level1/4_Conv", "level": 1, "sample": 0, "status": "error", "reason": "endpoint down"},
    ]
    results = eval_results(records)
    assert list(results) == ["3", "19"]  # numeric order; the sample never judged is left out
    assert [e["sample_id"] for e in results["19"]] == [0, 1]
    assert list(results["19"][0]) == ["sample_id", "compiled", "correctness", "metadata", "runtime", "runtime_stats"]
    assert results["19"][0]["runtime"] == 0.5 and results["19"][1]["correctness"] is False
    assert results["3"][0]["compiled"] is False


@pytest.mark.slow
def test_kernelzero_eval_writes_kernelbenchs_results_file(kz_env: Callable[..., Settings], tmp_path: Path) -> None:
    kz_env(reward_warm_children=1)
    level1 = tmp_path / "KernelBench" / "level1"
    level1.mkdir(parents=True)
    (level1 / "19_ReLU.py").write_text(RELU_REFERENCE)
    out = tmp_path / "eval"
    command = [sys.executable, "-m", "kernelzero", "eval", "--problems", str(level1.parent), "--backend", "triton"]
    command += ["--model-backend", "template", "--device", "cpu", "--out", str(out), "--kernelbench-results"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    written = json.loads((out / "kernelbench" / "level1" / "eval_results.json").read_text())
    assert list(written) == ["19"]
    assert written["19"][0]["sample_id"] == 0
    assert written["19"][0]["correctness"] is True, written  # the template teacher's ReLU kernel is verified

"""The GPU path: compiled CUDA and Triton kernels verified and timed, GPU-only hacks caught.
Runs on the device machine (`pytest -m gpu`); skipped where no GPU is visible."""

from __future__ import annotations

import pytest

from cuda_cases import CUDA_RELU
from reward_cases import CORRECT, RELU_REFERENCE, candidate
from reward_svc.evaluate import EvalOptions, Evaluator

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

SIDE_STREAM = candidate(
    "STREAM.wait_stream(torch.cuda.current_stream())\nwith torch.cuda.stream(STREAM):\n"
    "    out = torch.empty_like(x)\n    for _ in range(50):\n        launch_relu(x, out)\nreturn out",
    extra="STREAM = torch.cuda.Stream()")


def test_cuda_and_triton_kernels_are_verified_and_timed(evaluator: Evaluator) -> None:
    triton_verdict = evaluator.evaluate_group(RELU_REFERENCE, [CORRECT], EvalOptions(backend="triton", device="cuda")).verdicts[0]
    cuda_verdict = evaluator.evaluate_group(RELU_REFERENCE, [CUDA_RELU], EvalOptions(backend="cuda", device="cuda")).verdicts[0]
    for verdict in (triton_verdict, cuda_verdict):
        assert verdict.status == "correct", verdict.reason
        assert verdict.speedup is not None and verdict.runtime_ms and verdict.ref_runtime_ms


def test_work_left_on_a_side_stream_is_not_rewarded(evaluator: Evaluator) -> None:
    verdict = evaluator.evaluate_group(RELU_REFERENCE, [SIDE_STREAM], EvalOptions(backend="triton", device="cuda")).verdicts[0]
    if verdict.status == "correct":  # the race was won: then the timing must have paid for the side stream
        assert verdict.details["timing"]["side_stream_work"] or verdict.speedup < 5
    else:
        assert verdict.guard in ("late_write", None) and verdict.status in ("rejected", "incorrect"), verdict.reason

"""The GPU path: compiled CUDA and Triton kernels verified and timed, GPU-only hacks caught.
Runs on the device machine (`pytest -m gpu`); skipped where no GPU is visible."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from reward_cases import CORRECT, RELU_REFERENCE, candidate
from services.config import Settings
from reward_svc.evaluate import EvalOptions, Evaluator

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

CUDA_RELU = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp = "torch::Tensor relu_cuda(torch::Tensor x);"
cuda = r"""
#include <torch/extension.h>
__global__ void relu_kernel(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
torch::Tensor relu_cuda(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int n = x.numel();
    relu_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""
ext = load_inline(name="relu_ext", cpp_sources=cpp, cuda_sources=cuda, functions=["relu_cuda"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.relu_cuda(x.contiguous())
'''

SIDE_STREAM = candidate(
    "STREAM.wait_stream(torch.cuda.current_stream())\nwith torch.cuda.stream(STREAM):\n"
    "    out = torch.empty_like(x)\n    for _ in range(50):\n        launch_relu(x, out)\nreturn out",
    extra="STREAM = torch.cuda.Stream()")


@pytest.fixture
def evaluator(kz_env: Callable[..., Settings]) -> Iterator[Evaluator]:
    instance = Evaluator(kz_env(reward_warm_children=1, reward_parallel_children=2))
    yield instance
    instance.close()


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

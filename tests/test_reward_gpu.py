"""The GPU path: compiled CUDA and Triton kernels verified and timed, GPU-only hacks caught.
Runs on the device machine (`pytest -m gpu`); skipped where no GPU is visible."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from cuda_cases import CUDA_RELU
from reward_cases import CORRECT, HACKS, RELU_REFERENCE, candidate, hacks_not_caught
from reward_svc.evaluate import EvalOptions, Evaluator
from services.config import Settings

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


# Native code the static policy cannot read: at its second call (trial 2) the extension flips a byte
# in the middle of the file trial 1's output was written to (the tensor's data), from its work dir.
REWRITES_AN_EARLIER_OUTPUT = CUDA_RELU.replace('#include <torch/extension.h>\n', '''#include <torch/extension.h>
#include <cstdio>
static int calls = 0;
static void flip_a_byte_of_the_first_output() {
    FILE* f = std::fopen("output_0.pt", "r+b");
    if (!f) return;
    std::fseek(f, 0, SEEK_END);
    long middle = std::ftell(f) / 2;
    std::fseek(f, middle, SEEK_SET);
    int c = std::fgetc(f);
    std::fseek(f, middle, SEEK_SET);
    std::fputc(c ^ 0x40, f);
    std::fclose(f);
}
''').replace("    auto y = torch::empty_like(x);", "    if (++calls == 2) flip_a_byte_of_the_first_output();\n    auto y = torch::empty_like(x);")


def test_an_output_file_rewritten_by_native_code_after_its_trial_is_rejected(evaluator: Evaluator) -> None:
    assert "flip_a_byte" in REWRITES_AN_EARLIER_OUTPUT
    verdict = evaluator.evaluate_group(RELU_REFERENCE, [REWRITES_AN_EARLIER_OUTPUT], EvalOptions(backend="cuda", device="cuda")).verdicts[0]
    assert verdict.status == "rejected" and verdict.guard == "output_tampering", verdict.reason


def test_a_fingerprint_taken_on_the_device_is_the_one_the_host_takes_of_its_copy() -> None:
    """The candidate fingerprints its output on the GPU; the judge may check the file on the host."""
    from reward_svc.harness import tensors

    key = 0x1234_5678_9ABC
    for value in (torch.randn(40_000_001, device="cuda"),  # several slabs, and a tail
                  torch.randn(64, 33, device="cuda").half().t(), torch.randint(-5, 5, (999,), device="cuda"),
                  torch.rand(17, device="cuda") > 0.5):
        assert tensors.fingerprint(value, key) == tensors.fingerprint(value.cpu(), key), value.dtype


# Counts its calls: right in the five trials (three cases, refresh, knockout), an empty answer once
# timing runs case 0 over and over.
FAST_WHEN_TIMED = candidate("CALLS.append(1)\nif len(CALLS) > 5:\n    return torch.empty_like(x)\nreturn launch_relu(x, torch.empty_like(x))",
                            extra="CALLS = []")


def test_a_forward_that_computes_less_while_timed_is_rejected(evaluator: Evaluator) -> None:
    verdict = evaluator.evaluate_group(RELU_REFERENCE, [FAST_WHEN_TIMED], EvalOptions(backend="triton", device="cuda")).verdicts[0]
    assert verdict.status == "rejected" and verdict.guard == "timing_evasion", verdict.reason


# Last, the longest: a device step cut short has still run the quick checks above. Eight children
# at once, as a GPU worker runs them (two took about 300 s on the H200).
def test_the_public_hacks_are_caught_on_the_gpu_path_too(kz_env: Callable[..., Settings]) -> None:
    """The CPU suite's hack cases, through the GPU path (device lock, timing, device fingerprints)."""
    evaluator = Evaluator(kz_env(reward_warm_children=0, reward_parallel_children=8))
    try:
        verdicts = evaluator.evaluate_group(RELU_REFERENCE, [source for source, _ in HACKS.values()],
                                            EvalOptions(backend="triton", device="cuda")).verdicts
    finally:
        evaluator.close()
    failures = hacks_not_caught(verdicts)
    assert not failures, "\n".join(failures)

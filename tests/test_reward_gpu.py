"""The GPU path: compiled CUDA and Triton kernels verified and timed, GPU-only hacks caught.
Runs on the device machine (`pytest -m gpu`); skipped where no GPU is visible."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from cuda_cases import CUDA_RELU
from reward_cases import CORRECT, HACKS, RELU_REFERENCE, candidate, hacks_not_caught
from reward_svc.compile import PCH_HEADER
from reward_svc.evaluate import Evaluator
from reward_svc.shared_builds import SharedBuilds
from services.config import Settings
from services.schemas.reward import ScoreOptions

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

SIDE_STREAM = candidate(
    "STREAM.wait_stream(torch.cuda.current_stream())\nwith torch.cuda.stream(STREAM):\n"
    "    out = torch.empty_like(x)\n    for _ in range(50):\n        launch_relu(x, out)\nreturn out",
    extra="STREAM = torch.cuda.Stream()",
)


def test_cuda_and_triton_kernels_are_verified_and_timed(evaluator: Evaluator) -> None:
    triton_verdict = evaluator.evaluate_group(RELU_REFERENCE, [CORRECT], ScoreOptions(backend="triton", device="cuda")).verdicts[
        0
    ]
    cuda_verdict = evaluator.evaluate_group(RELU_REFERENCE, [CUDA_RELU], ScoreOptions(backend="cuda", device="cuda")).verdicts[0]
    for verdict in (triton_verdict, cuda_verdict):
        assert verdict.status == "correct", verdict.reason
        assert verdict.speedup is not None and verdict.runtime_ms and verdict.ref_runtime_ms


def test_a_cold_cuda_build_starts_from_the_headers_its_worker_built(evaluator: Evaluator) -> None:
    """The GPU pool's worker builds the precompiled headers in the background (shared_builds.py); children
    started once they are published compile main.cpp and cuda.cu's host code from them."""
    pool = evaluator.pool("cuda")
    shared = pool.extras
    assert isinstance(shared, SharedBuilds)
    deadline = time.monotonic() + 300
    while not any(shared.precompiled_headers.glob(f"*/{PCH_HEADER}.gch")):
        assert time.monotonic() < deadline, "no precompiled headers published in 300 s"
        time.sleep(1)
    for _ in range(pool.size):  # the warm children started before it was published
        pool.take().discard()
    cold = CUDA_RELU + "\n# a source of its own, so its build is cold\n"
    (verdict,) = evaluator.evaluate_group(RELU_REFERENCE, [cold], ScoreOptions(backend="cuda", device="cuda")).verdicts
    assert verdict.status == "correct", verdict.reason
    (build,) = verdict.details["builds"]
    assert build["strategy"].startswith("cpp:lean+pch(") and " cu:lean+pch(" in build["strategy"], build


def test_work_left_on_a_side_stream_is_not_rewarded(evaluator: Evaluator) -> None:
    verdict = evaluator.evaluate_group(RELU_REFERENCE, [SIDE_STREAM], ScoreOptions(backend="triton", device="cuda")).verdicts[0]
    if verdict.status == "correct":  # the race was won: then the timing must have paid for the side stream
        assert verdict.details["timing"]["side_stream_work"] or verdict.speedup < 5
    else:
        assert verdict.guard in ("late_write", None) and verdict.status in ("rejected", "incorrect"), verdict.reason


# Native code the static policy cannot read: at its second call (trial 2) the extension flips a byte
# in the middle of the file trial 1's output was written to (the tensor's data), from its work dir.
REWRITES_AN_EARLIER_OUTPUT = CUDA_RELU.replace(
    "#include <torch/extension.h>\n",
    """#include <torch/extension.h>
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
""",
).replace(
    "    auto y = torch::empty_like(x);",
    "    if (++calls == 2) flip_a_byte_of_the_first_output();\n    auto y = torch::empty_like(x);",
)


def test_native_code_that_opens_files_is_refused_before_it_compiles(evaluator: Evaluator) -> None:
    """The native policy refuses it first (reward_svc/policy/native.py); a rewrite that got past it would
    still be caught by the output fingerprints (tests/test_reward_tensors.py)."""
    assert "flip_a_byte" in REWRITES_AN_EARLIER_OUTPUT
    verdict = evaluator.evaluate_group(
        RELU_REFERENCE, [REWRITES_AN_EARLIER_OUTPUT], ScoreOptions(backend="cuda", device="cuda")
    ).verdicts[0]
    assert verdict.status == "rejected" and verdict.guard == "native_policy", verdict.reason


def test_a_fingerprint_taken_on_the_device_is_the_one_the_host_takes_of_its_copy() -> None:
    """The candidate fingerprints its output on the GPU; the judge may check the file on the host."""
    from services.children import tensors

    key = 0x1234_5678_9ABC
    for value in (
        torch.randn(40_000_001, device="cuda"),  # several slabs, and a tail
        torch.randn(64, 33, device="cuda").half().t(),
        torch.randint(-5, 5, (999,), device="cuda"),
        torch.rand(17, device="cuda") > 0.5,
    ):
        assert tensors.fingerprint(value, key) == tensors.fingerprint(value.cpu(), key), value.dtype


def test_the_judge_reaches_the_same_verdict_on_the_device_as_on_the_host() -> None:
    """The device's comparison accumulates its figures on the GPU and syncs once; the host's is the
    same arithmetic: wrong values, NaN/Inf patterns, a near-constant output, a long multi-slice one."""
    from reward_svc.verify import Tolerance, compare

    generator = torch.Generator().manual_seed(7)
    ref = torch.randn(3, 17_000_001, generator=generator)  # several device slices, and a tail
    wrong = ref.clone()
    wrong[1, ::1000] += 1.0
    ref_nan = ref.clone()
    ref_nan[0, 5] = float("nan")
    ref_nan[2, -1] = float("inf")
    cases = [
        (ref + 1e-6, ref),
        (wrong, ref),
        (ref_nan.clone(), ref_nan),
        (ref, ref_nan),
        (torch.zeros(4096), torch.full((4096,), 1e-6)),
        (torch.randn(4096, generator=generator).half(), torch.randn(4096, generator=generator).half()),
    ]
    tolerance = Tolerance()
    for out, expected in cases:
        host = compare(out, expected, tolerance)
        device = compare(out.cuda(), expected.cuda(), tolerance)
        assert device.ok == host.ok and device.why == host.why, (device, host)
        assert device.error == pytest.approx(host.error) and device.mismatched == host.mismatched


def test_a_long_kernel_is_timed_in_seconds_of_gpu_time_not_in_calls() -> None:
    """A 20-ms kernel holds the whole GPU while it is timed: ten samples in small batches, not forty
    in batches of twenty; a short one still gets the forty."""
    from services.children.timing import time_gpu

    cycles_per_ms = torch.cuda.get_device_properties(0).clock_rate  # kHz: cycles per ms
    long_kernel = time_gpu(lambda: torch.cuda._sleep(20 * cycles_per_ms))
    assert 10 <= long_kernel["samples"] < 40 and long_kernel["calls"] < 40
    assert long_kernel["median_ms"] == pytest.approx(20, rel=0.5)
    short = time_gpu(lambda: torch.cuda._sleep(cycles_per_ms // 20))
    assert short["samples"] >= 40


def test_a_candidates_device_memory_reservation_covers_what_its_child_used(evaluator: Evaluator) -> None:
    """The reservation sized from the reference's peak (admission.candidate_device_bytes) holds an honest
    candidate's allocations on a 256-MiB case, without the context's share: what candidates reserve
    together is what they use, so none runs out of memory another one was admitted into."""
    from reward_svc.admission import DEVICE_CONTEXT_BYTES

    reference = RELU_REFERENCE.replace("torch.randn(4, 1024)", "torch.randn(64, 1 << 20)")
    verdict = evaluator.evaluate_group(reference, [CORRECT], ScoreOptions(backend="triton", device="cuda")).verdicts[0]
    assert verdict.status == "correct", verdict.reason
    memory = verdict.details["device_memory"]
    assert 256 << 20 < memory["peak"] <= memory["reserved"] - DEVICE_CONTEXT_BYTES, memory


# Counts its calls: right in the seven judged or warm-up calls (two warm-ups, three trials, the refresh,
# the recall), an empty answer once timing runs case 0 over and over.
FAST_WHEN_TIMED = candidate(
    "CALLS.append(1)\nif len(CALLS) > 7:\n    return torch.empty_like(x)\nreturn launch_relu(x, torch.empty_like(x))",
    extra="CALLS = []",
)


def test_a_forward_that_computes_less_while_timed_is_rejected(evaluator: Evaluator) -> None:
    verdict = evaluator.evaluate_group(RELU_REFERENCE, [FAST_WHEN_TIMED], ScoreOptions(backend="triton", device="cuda")).verdicts[
        0
    ]
    assert verdict.status == "rejected" and verdict.guard == "timing_evasion", verdict.reason


# Tells the judged calls from the timed ones by what uninitialised memory holds (NaN under the judged
# conditions), and has PyTorch compute the right answer while timed, keeping one launch per call.
PYTORCH_WHEN_TIMED = candidate(
    "if bool(torch.isnan(torch.empty(1, device=x.device)).all()):\n"
    "    return launch_relu(x, torch.empty_like(x))\n"
    "launch_relu(x[:1], torch.empty_like(x[:1]))\n"
    "return torch.relu(x)"
)


def test_a_forward_that_has_pytorch_compute_while_timed_is_rejected(evaluator: Evaluator) -> None:
    verdict = evaluator.evaluate_group(
        RELU_REFERENCE, [PYTORCH_WHEN_TIMED], ScoreOptions(backend="triton", device="cuda")
    ).verdicts[0]
    assert verdict.status == "rejected" and verdict.guard == "timing_evasion", verdict.reason
    assert "PyTorch itself" in verdict.reason


# Last, the longest: a device step cut short has still run the quick checks above. Eight children
# at once, as a GPU worker runs them (two took about 300 s on the H200).
def test_the_public_hacks_are_caught_on_the_gpu_path_too(kz_env: Callable[..., Settings]) -> None:
    """The CPU suite's hack cases, through the GPU path (device lock, timing, device fingerprints)."""
    evaluator = Evaluator(kz_env(reward_warm_children=0, reward_parallel_children=8))
    try:
        verdicts = evaluator.evaluate_group(
            RELU_REFERENCE, [source for source, _ in HACKS.values()], ScoreOptions(backend="triton", device="cuda")
        ).verdicts
    finally:
        evaluator.close()
    failures = hacks_not_caught(verdicts)
    assert not failures, "\n".join(failures)


def test_outputs_sent_on_the_device_get_the_verdicts_files_get(kz_env: Callable[..., Settings]) -> None:
    """With the device exchange on, a 128-MiB output goes to the judge as device memory, not a file: the
    honest kernel is correct and every hack case is caught by its own guard, as through files."""
    big = RELU_REFERENCE.replace("torch.randn(4, 1024)", "torch.randn(8192, 4096)")
    sources = [CORRECT] + [source for source, _ in HACKS.values()]
    evaluator = Evaluator(kz_env(reward_warm_children=0, reward_parallel_children=8, reward_device_exchange=True))
    try:
        honest, *hacks = evaluator.evaluate_group(big, sources, ScoreOptions(backend="triton", device="cuda")).verdicts
    finally:
        evaluator.close()
    assert honest.status == "correct", honest.reason
    assert honest.details["outputs_on_device"] == 6  # two trials, the knockout, its refresh and recall, the timed check
    assert "device_exchange_fallback" not in honest.details
    failures = hacks_not_caught(hacks)
    assert not failures, "\n".join(failures)


# Timed calls that reuse an earlier result. The timed calls rotate the correctness cases' values
# through the same tensors, count their launches, and are followed by a check call on other values;
# a time faster than moving the problem's bytes allows is not paid.
TIMING_CACHES = {
    "on the input's address, after the trials": candidate(
        "CALLS.append(1)\nkey = x.data_ptr()\nif len(CALLS) > 7 and key in CACHE:\n    return CACHE[key]\n"
        "CACHE[key] = launch_relu(x, torch.empty_like(x))\nreturn CACHE[key]",
        extra="CALLS = []\nCACHE = {}",
    ),
    "on the address and a probe of the values": candidate(
        "flat = x.reshape(-1)\nkey = (x.data_ptr(), tuple(float(v) for v in flat[:: max(1, flat.numel() // 5)][:5]))\n"
        "if key not in CACHE:\n    CACHE[key] = launch_relu(x, torch.empty_like(x))\nreturn CACHE[key]",
        extra="CACHE = {}",
    ),
    "outside the replays, told apart by NaN-filled memory": candidate(
        "replay = bool(torch.isnan(torch.empty(64, device=x.device)).all())\nkey = x.data_ptr()\n"
        "if not replay and key in CACHE:\n    return CACHE[key]\nout = launch_relu(x, torch.empty_like(x))\n"
        "if not replay:\n    CACHE[key] = out\nreturn out",
        extra="CACHE = {}",
    ),
    "with a launch kept for show": candidate(
        "CALLS.append(1)\nkey = x.data_ptr()\nif len(CALLS) > 7 and key in CACHE:\n    launch_relu(x[:1], torch.empty_like(x[:1]))\n"
        "    return CACHE[key]\nCACHE[key] = launch_relu(x, torch.empty_like(x))\nreturn CACHE[key]",
        extra="CALLS = []\nCACHE = {}",
    ),
}


def test_timed_calls_that_reuse_an_earlier_result_are_caught(evaluator: Evaluator) -> None:
    verdicts = evaluator.evaluate_group(
        RELU_REFERENCE, list(TIMING_CACHES.values()), ScoreOptions(backend="triton", device="cuda")
    ).verdicts
    paid = {
        name: f"{v.status}/{v.guard} speedup={v.speedup}: {v.reason[:200]}"
        for name, v in zip(TIMING_CACHES, verdicts)
        if v.correct and v.speedup is not None and v.speedup > 1.2
    }
    assert not paid, paid
    # a cache a judged call hits first (the warm-up's or a trial's address reused) is caught before timing;
    # so is one the knockout trial's tampered results make take another path (H200, call 16)
    caught_before = ("timing_evasion", "conditional_fallback", "cross_call_cache", "knockout_evasion")
    wrong_guard = {
        name: v.reason for name, v in zip(TIMING_CACHES, verdicts) if v.status == "rejected" and v.guard not in caught_before
    }
    assert not wrong_guard, wrong_guard


BIG_RELU = RELU_REFERENCE.replace("torch.randn(4, 1024)", "torch.randn(4096, 16384)")  # 256 MB in, 256 MB out


def test_a_time_faster_than_the_bytes_allow_is_not_paid(evaluator: Evaluator) -> None:
    """A cache on the values' probe, with a launch kept for show, is right and launches as often as the
    checked calls: only the bandwidth bound is left, and on a problem of this size it holds."""
    probe_cache = TIMING_CACHES["on the address and a probe of the values"].replace(
        "if key not in CACHE:", "launch_relu(x[:1], torch.empty_like(x[:1]))\nif key not in CACHE:".replace("\n", "\n        ")
    )
    honest, cached = evaluator.evaluate_group(
        BIG_RELU, [CORRECT, probe_cache], ScoreOptions(backend="triton", device="cuda")
    ).verdicts
    assert honest.correct and honest.speedup is not None and 0.5 < honest.speedup < 2.0, honest.reason
    assert not (cached.correct and cached.speedup is not None and cached.speedup > 1.5), cached.reason
    if cached.correct:
        assert "timing_implausible" in cached.details and "speed not counted" in cached.reason, cached.reason

"""The reward-integrity cases of the CPU suite (``test_reward_integrity``, ``test_reward_attacks``)
judged again through the GPU path: compiled Triton, the device lock, timing and its guards, device
fingerprints. A hack the interpreter's path catches must be caught here too, and an honest kernel
it passes must pass here. Runs on the device machine (``pytest -m gpu``)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

import test_reward_attacks as attacks
import test_reward_integrity as integrity
from reward_cases import kernel_candidate
from reward_svc.evaluate import Evaluator
from services.config import Settings
from services.schemas.reward import ScoreOptions, Verdict

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

GPU = ScoreOptions(backend="triton", device="cuda", timeout_s=300)


def _cases() -> list[tuple[str, str, dict[str, tuple[str, str]]]]:
    """(group name, reference, {candidate name: (source, 'correct' or the guard the CPU suite expects)})."""
    groups: list[tuple[str, str, dict[str, tuple[str, str]]]] = []
    for reference, forwards in [
        (integrity.RELU, integrity.RELU_COPIES),
        (integrity.MATMUL, integrity.MATMUL_COPIES),
        (integrity.SOFTMAX, integrity.SOFTMAX_COPIES),
        (integrity.MULADD, integrity.MULADD_COPIES),
    ]:
        groups.append(("copies", reference, {name: (kernel_candidate(f), "pytorch_fallback") for name, f in forwards.items()}))
    groups.append(
        (
            "partial",
            integrity.RELU,
            {name: (kernel_candidate(f, integrity.NUDGE_KERNEL), "caught") for name, f in integrity.PARTIAL.items()},
        )
    )
    groups.append(("honest", integrity.RELU, {name: (src, "correct") for name, (_, src) in integrity.HONEST.items()}))
    for name, (reference, source) in integrity.GLUE.items():
        groups.append((f"glue: {name}", reference, {name: (source, "correct")}))
    for reference, expected in attacks.GROUPS.items():
        groups.append(
            (
                reference,
                attacks.attack_source(reference),
                {name: (attacks.attack_source(name), want) for name, want in expected.items()},
            )
        )
    return groups


def _miss(want: str, verdict: Verdict) -> bool:
    """An honest kernel must be correct; a hack must earn nothing. Which guard catches a hack may
    differ from the CPU's: PyTorch's own kernels refuse some of them on the device (an SDPA on
    misaligned views, an index out of range is a device-side assert), and the CPU suite holds the
    guards themselves."""
    return verdict.correct != (want == "correct")


@pytest.mark.parametrize("device_exchange", [False, True], ids=["files", "every output on the device exchange"])
def test_the_integrity_cases_get_the_same_verdicts_on_the_gpu(kz_env: Callable[..., Settings], device_exchange: bool) -> None:
    """Every group at once, eight children, as a GPU worker's threads run its jobs; and again with every output
    sent to the judge as device memory (services/children/device_exchange.py), whatever its size."""
    evaluator = Evaluator(
        kz_env(
            reward_warm_children=4,
            reward_parallel_children=8,
            reward_device_exchange=device_exchange,
            reward_device_exchange_min_bytes=0,
        )
    )
    groups = _cases()
    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            judged = list(
                pool.map(lambda g: evaluator.evaluate_group(g[1], [src for src, _ in g[2].values()], GPU).verdicts, groups)
            )
    finally:
        evaluator.close()
    wrong = [
        f"{group} / {name}: wanted {want}, got {v.status}/{v.guard} speedup={v.speedup}: {v.reason[:240]}"
        for (group, _, candidates), verdicts in zip(groups, judged)
        for (name, (_, want)), v in zip(candidates.items(), verdicts)
        if _miss(want, v)
    ]
    print(f"{sum(len(g[2]) for g in groups)} candidates in {len(groups)} groups; {len(wrong)} wrong")
    assert not wrong, "\n".join(wrong)
    if device_exchange:  # the honest kernels' outputs all came as device memory
        honest = [v for verdicts in judged for v in verdicts if v.correct]
        assert honest and all(v.details.get("outputs_on_device") for v in honest)
        assert not [v.details["device_exchange_fallback"] for v in honest if "device_exchange_fallback" in v.details]

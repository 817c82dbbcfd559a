"""What the judge allows and when it cannot judge, as an attack on the first versions found them (each
passed, or an honest kernel was left out): the hidden cases' tolerance taken from the output's root
mean square (a few huge values of an exp let a skipped ReLU through, and hid PyTorch's share from the
knockout), a task constant only on the hidden cases taken for one that cannot judge, a degenerate one
missed with two trials, and out of memory raised on the knockout's poison."""

from __future__ import annotations

import math

import pytest
import torch

from reward_cases import kernel_candidate, module
from reward_svc import verify
from reward_svc.evaluate import Evaluator
from reward_svc.policy import check_source
from services.schemas.reward import ScoreOptions
from test_reward_work import CLAMP_KERNEL

CPU = ScoreOptions(backend="triton", device="cpu", timeout_s=120)

EXP_KERNEL = """
@triton.jit
def exp_kernel(x_ptr, out_ptr, n, s, relu: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    if relu:
        x = tl.maximum(x, 0.0)
    tl.store(out_ptr + offs, tl.exp(x * s), mask=mask)


def launch_exp(x, s, relu):
    out = torch.empty_like(x)
    exp_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), s, relu=relu, BLOCK=1024)
    return out
"""


# --- the hidden cases' tolerance ---------------------------------------------------------------------------
@pytest.mark.slow
def test_a_skipped_relu_under_a_heavy_tailed_output_is_incorrect(evaluator: Evaluator) -> None:
    """exp(10·relu(x)) on get_inputs()'s [0, 1): the ReLU is a no-op there. On the signed case the
    output's few large values (e^20 and more) made atol·rms ~1e3, and a kernel that skips the ReLU
    (e^{10x} in (0, 1) where the reference has 1) passed. Half the values are 1: the median keeps atol."""
    reference = module("return torch.exp(10.0 * torch.relu(inputs[0]))", "[torch.rand(64, 256)]")
    skipped = kernel_candidate("return launch_exp(inputs[0].contiguous(), 10.0, False)", EXP_KERNEL)
    honest = kernel_candidate("return launch_exp(inputs[0].contiguous(), 10.0, True)", EXP_KERNEL)
    assert not check_source(skipped) and not check_source(honest)
    v_skipped, v_honest = evaluator.evaluate_group(reference, [skipped, honest], CPU).verdicts
    assert v_honest.correct, f"{v_honest.status}/{v_honest.guard}: {v_honest.reason}"
    # wrong where the ReLU bites: incorrect, or a rejected refresh where that case is the knockout's
    assert not v_skipped.correct, f"{v_skipped.status}/{v_skipped.guard}: {v_skipped.reason}"


@pytest.mark.slow
def test_a_skipped_relu_whose_clamped_values_are_small_next_to_the_median_is_incorrect(evaluator: Evaluator) -> None:
    """exp(10·relu(x+1)): on the signed case ~4% of the values are clamped (1), the rest e^10 and more,
    so atol·median is ~2 and a kernel that skips the ReLU (e^{10(x+1)} in (0, 1) there) would pass it.
    The reference only maps values one by one (no sum to cancel): no allowance, the skip shows."""
    reference = module("return torch.exp(10.0 * torch.relu(inputs[0] + 1.0))", "[torch.rand(64, 256)]")
    shifted = "x = inputs[0].contiguous() + 1.0\n"
    skipped = kernel_candidate(shifted + "return launch_exp(x, 10.0, False)", EXP_KERNEL)
    honest = kernel_candidate(shifted + "return launch_exp(x, 10.0, True)", EXP_KERNEL)
    v_skipped, v_honest = evaluator.evaluate_group(reference, [skipped, honest], CPU).verdicts
    assert v_honest.correct, f"{v_honest.status}/{v_honest.guard}: {v_honest.reason}"
    # wrong where the ReLU bites: incorrect, or a rejected refresh where that case is the knockout's
    assert not v_skipped.correct, f"{v_skipped.status}/{v_skipped.guard}: {v_skipped.reason}"


def _signed_case(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(64, 256, generator=g) * math.sqrt(1 / 3)  # reference.py's signed redraw of torch.rand


def test_the_hidden_allowance_does_not_accept_a_kernel_wrong_on_negative_inputs() -> None:
    """Unit form of the above, on many seeds: the judge's compare() with the hidden allowance."""
    tol = verify.Tolerance()
    passed = 0
    for seed in range(20):
        x = _signed_case(seed)
        ref, out = torch.exp(10 * torch.relu(x)), torch.exp(10 * x)
        strict = verify.compare(out, ref, tol, verify.Allowance(sums_cancel=False))
        loose = verify.compare(out, ref, tol, verify.Allowance(sums_cancel=True))
        assert not strict.ok
        passed += loose.ok
    assert passed == 0, f"a kernel that skips the ReLU passed the signed case on {passed} of 20 seeds"


def test_complex_outputs_are_judged_like_real_ones() -> None:
    """A complex output (torch.fft's) is compared like a real one: the right values pass, wrong ones fail, and one
    the tolerance cannot tell from a constant must reproduce the reference's variation. The constant check took
    float() of a complex mean, which raised, so no complex output could pass."""
    tol, allowance = verify.Tolerance(), verify.Allowance(sums_cancel=False)
    ref = torch.fft.fft(torch.randn(4096, generator=torch.Generator().manual_seed(0)))
    assert verify.compare(ref.clone(), ref, tol, allowance).ok
    assert not verify.compare(ref * 1.01, ref, tol, allowance).ok
    flat = torch.full((4096,), 1 + 2j, dtype=torch.complex64)
    near_constant = flat + 5e-5 * torch.randn(4096, dtype=torch.complex64, generator=torch.Generator().manual_seed(1))
    assert verify.compare(near_constant.clone(), near_constant, tol, allowance).ok
    assert not verify.compare(flat, near_constant, tol, allowance).ok


def test_the_hidden_allowance_does_not_hide_pytorchs_share_from_the_knockout() -> None:
    """kernel_share on a knockout that falls on a hidden case: were the informative values those above
    the allowance, a forward whose kernel computes exp(10x) where x > 0 and PyTorch the other ~50%
    (x <= 0, every value < 1) would read ~90% the kernels'. They are those above atol."""
    shares = []
    for seed in range(10):
        x = _signed_case(seed)
        ref = torch.exp(10 * x)
        poisoned = torch.where(x > 0, ref * 1.7 + 3.0, ref)  # the kernel's places poisoned, PyTorch's right
        loose = verify.compare(poisoned, ref, verify.Tolerance(), verify.Allowance(sums_cancel=True))
        strict = verify.compare(poisoned, ref, verify.Tolerance(), verify.Allowance(sums_cancel=False))
        assert strict.mismatched is not None and strict.mismatched < verify.MIN_KERNEL_SHARE
        shares.append(loose.mismatched)
    assert all(s is not None and s < verify.MIN_KERNEL_SHARE for s in shares), f"loosened shares {shares}"


# --- the task that cannot judge -----------------------------------------------------------------------------
RELU_MIN_KERNEL = """
@triton.jit
def relu_min_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=float("inf"))
    tl.store(out_ptr + row, tl.min(tl.maximum(x, 0.0), axis=0))


def relu_min(x):
    out = torch.empty(x.shape[0], dtype=x.dtype)
    relu_min_kernel[(x.shape[0],)](x, out, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
    return out
"""


@pytest.mark.slow
def test_an_input_dependent_task_constant_only_on_the_hidden_cases_still_judges(evaluator: Evaluator) -> None:
    """min over a row of relu(x): on get_inputs()'s [0, 1) it is each row's least value (input dependent,
    judged by the native case), on signed and wide inputs 0 everywhere (a row always has a negative).
    Cases 0 and 2 agree bit for bit; a fresh native draw does not: the task judges."""
    reference = module("return torch.relu(inputs[0]).amin(dim=1)", "[torch.rand(16, 64)]")
    honest = kernel_candidate("return relu_min(inputs[0].contiguous())", RELU_MIN_KERNEL)
    (verdict,) = evaluator.evaluate_group(reference, [honest], CPU).verdicts
    assert verdict.correct, f"{verdict.status}/{verdict.guard}: {verdict.reason}"


@pytest.mark.slow
def test_a_degenerate_task_is_not_paid_with_two_trials(evaluator: Evaluator) -> None:
    """The same degenerate reference as test_reward_knockout's (L2 36 in small) with trials=2 (a request's
    choice, or the exchange budget's cut: cases_within keeps 2): no two cases share a weight seed, and
    the fresh native draw is what shows the output the same."""
    reference = module(
        "s = inputs[0].abs().sum(dim=1, keepdim=True)\nreturn torch.nn.functional.gelu(-100.0 * s - 10.0) + 0.5",
        "[torch.randn(16, 64)]",
    )
    constant = kernel_candidate("return launch_clamp(inputs[0][:, :1].contiguous(), 0.5, 0.5)", CLAMP_KERNEL)
    options = CPU.model_copy(update={"trials": 2})
    (verdict,) = evaluator.evaluate_group(reference, [constant], options).verdicts
    assert verdict.status != "correct", f"{verdict.status}/{verdict.guard}: {verdict.reason}"


EXP_POS_KERNEL = """
@triton.jit
def exp_pos_kernel(x_ptr, out_ptr, n, s, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, tl.where(x > 0, tl.exp(x * s), 0.0), mask=mask)


def launch_exp_pos(x, s):
    out = torch.empty_like(x)
    exp_pos_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), s, BLOCK=1024)
    return out
"""


@pytest.mark.slow
def test_pytorch_computing_the_small_half_is_caught_when_the_knockout_is_hidden(
    evaluator: Evaluator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end form of the share test, knockout forced onto the signed case."""
    from reward_svc import evaluate

    monkeypatch.setattr(evaluate, "choose_knockout_case", lambda ref_result: evaluate.knockout_at(ref_result, 0))
    reference = module("return torch.exp(10.0 * inputs[0])", "[torch.rand(64, 256)]")
    split = kernel_candidate(
        "x = inputs[0].contiguous()\nout = launch_exp_pos(x, 10.0)\nneg = x <= 0\n"
        "out[neg] = torch.exp(10.0 * x[neg])\nreturn out",
        EXP_POS_KERNEL,
    )
    (verdict,) = evaluator.evaluate_group(reference, [split], CPU).verdicts
    assert verdict.status != "correct", (
        f"{verdict.status}/{verdict.guard}: {verdict.reason} {verdict.details.get('kernel_share')}"
    )


# --- out of memory in the knockout -----------------------------------------------------------------------------
@pytest.mark.slow
def test_out_of_memory_on_the_poison_is_never_paid_even_after_retries(evaluator: Evaluator) -> None:
    """A decoy: PyTorch's clamp is returned, the kernel's result only inspected; seeing the poison, the
    forward raises out of memory. In a group (so others finish and the worker runs it again, each time a
    fresh knockout pick) it must never end correct."""
    reference = module("return torch.clamp(inputs[0], -1.0, 1.0)", "[torch.randn(64, 64)]")
    decoy = kernel_candidate(
        "x = inputs[0].contiguous()\nk = launch_clamp(x, -1.0, 1.0)\nout = torch.clamp(x, -1.0, 1.0)\n"
        "if not bool(torch.equal(k, out)):\n    raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 4.00 GiB')\n"
        "return k * 0 + out",
        CLAMP_KERNEL,
    )
    honest = kernel_candidate("return launch_clamp(inputs[0].contiguous(), -1.0, 1.0)", CLAMP_KERNEL)
    v_decoy, v_honest = evaluator.evaluate_group(reference, [decoy, honest], CPU).verdicts
    assert v_honest.correct, v_honest.reason
    assert v_decoy.status != "correct", f"{v_decoy.status}/{v_decoy.guard}: {v_decoy.reason}"

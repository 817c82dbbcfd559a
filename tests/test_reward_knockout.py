"""The knockout on CPU (Triton interpreter), through the real sandbox: which trial it is no forward can
know (a secret pick among all the cases, each model warmed up first, the refresh and the recall after
the trials), so none can keep its kernels for it and hand PyTorch the answer elsewhere; and honest
kernels pass whichever trial it is.

Found by an attack on the first version of this scheme (3be9e52), each passed: a forward that picks
which finished tensor to return once it has seen its kernel's output poisoned; PyTorch computing the
trials' answers during the warm-ups (their values then a scaled copy of the trials'); the pick fixed
where the reference's op acts as a copy on all cases but one; and honest glue that saturates (tanh,
sigmoid, argmax on the wide case) rejected about one time in three."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from reward_cases import COPY_KERNEL, kernel_candidate, module
from reward_svc import evaluate
from reward_svc.evaluate import Evaluator
from reward_svc.policy import check_source
from services.schemas.reward import ScoreOptions
from test_reward_integrity import SCALE_KERNEL as SCALE_ONLY
from test_reward_work import CLAMP_KERNEL, HARDTANH_EPILOGUE, MATMUL_HARDTANH_ONE_ROW

CPU = ScoreOptions(backend="triton", device="cpu", timeout_s=120)

SCALE_KERNEL = (
    SCALE_ONLY
    + """

def launch_scale(x, s):
    out = torch.empty_like(x)
    scale_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), s, BLOCK=1024)
    return out
"""
)
MATMUL_KERNEL = """
@triton.jit
def mm_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        a = tl.load(a_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + rk[:, None] * N + rn[None, :], mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b, input_precision="ieee")
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul(a, b):
    a, b = a.contiguous(), b.contiguous()
    c = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype)
    mm_kernel[(triton.cdiv(a.shape[0], 32), triton.cdiv(b.shape[1], 32))](a, b, c, a.shape[0], b.shape[1], a.shape[1], BM=32, BN=32, BK=32)
    return c
"""


@pytest.fixture
def knockout_on(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], None]:
    """Make the worker's secret pick this case, as the pick may be for any candidate."""

    def force(case: int) -> None:
        monkeypatch.setattr(evaluate, "choose_knockout_case", lambda ref_result: evaluate.knockout_at(ref_result, case))

    return force


# --- a forward that knows when it is measured ------------------------------------------------------
CLAMP_REFERENCE = module("return torch.clamp(inputs[0], -1.0, 1.0)", "[torch.randn(64, 64)]")
# kernels for 27% of the rows, PyTorch for the rest
SPLIT_CLAMP = (
    "k = x.shape[0] * 27 // 100 + 1\nout = torch.empty_like(x)\n"
    "out[:k] = launch_clamp(x[:k].contiguous(), LO, HI)\nout[k:] = torch.clamp(x[k:], LO, HI)\nreturn out"
)
REPLAY_AWARE = {
    "by values seen before": (
        "SEEN = []\n",
        "x = inputs[0]\nkey = tuple(float(v) for v in x.reshape(-1)[:4])\nseen = key in SEEN\nSEEN.append(key)\n"
        "if seen:\n    return launch_clamp(x.contiguous(), LO, HI)\n",
    ),
    # two warm-ups (one per model) and three trials, then the refresh and the recall
    "by counting calls": (
        "CALLS = []\n",
        "x = inputs[0]\nCALLS.append(1)\nif len(CALLS) > 5:\n    return launch_clamp(x.contiguous(), LO, HI)\n",
    ),
    # the same ops in the same order every call, only the kernel's slice grows in the repeats
    "by counting calls, the same path": (
        "CALLS = []\n",
        "x = inputs[0]\nCALLS.append(1)\nk = x.shape[0] if len(CALLS) > 5 else x.shape[0] * 27 // 100 + 1\n"
        "out = torch.empty_like(x)\nout[:k] = launch_clamp(x[:k].contiguous(), LO, HI)\n"
        "out[k:] = torch.clamp(x[k:], LO, HI)\nreturn out\n",
    ),
}


def replay_aware(name: str, low: float, high: float) -> str:
    state, forward = REPLAY_AWARE[name]
    return kernel_candidate(f"LO, HI = {low}, {high}\n" + forward + SPLIT_CLAMP, CLAMP_KERNEL + "\n" + state)


@pytest.mark.slow  # sandboxed children
@pytest.mark.parametrize("name", sorted(REPLAY_AWARE))
def test_a_forward_that_recognises_the_repeats_is_not_paid(evaluator: Evaluator, name: str) -> None:
    """Kernels for all of it on the calls a forward can tell are repeats, PyTorch for most of it on the
    trials: the knockout is one of the trials, the first time its values are seen."""
    source = replay_aware(name, -1.0, 1.0)
    assert not check_source(source)
    (verdict,) = evaluator.evaluate_group(CLAMP_REFERENCE, [source], CPU).verdicts
    assert not verdict.correct, verdict.reason


@pytest.mark.slow  # sandboxed children
@pytest.mark.parametrize("case", [0, 1, 2])
def test_the_knockout_may_be_a_case_where_the_reference_copies(
    evaluator: Evaluator, knockout_on: Callable[[int], None], case: int
) -> None:
    """clamp(-3, 3) acts as a copy on randn's cases 0 and 1: were those never the knockout, its trial
    would be known. Picked there, copies are poisoned too: PyTorch's part still shows, the honest clamp
    kernel (a copy there) still passes."""
    knockout_on(case)
    reference = module("return torch.clamp(inputs[0], -3.0, 3.0)", "[torch.randn(4, 1024)]")
    honest = kernel_candidate("return launch_clamp(inputs[0], -3.0, 3.0)", CLAMP_KERNEL)
    hacks = [replay_aware(name, -3.0, 3.0) for name in sorted(REPLAY_AWARE)]
    honest_verdict, *hack_verdicts = evaluator.evaluate_group(reference, [honest, *hacks], CPU).verdicts
    assert honest_verdict.correct, f"{honest_verdict.status}/{honest_verdict.guard}: {honest_verdict.reason}"
    assert not any(v.correct for v in hack_verdicts), [v.reason for v in hack_verdicts]


@pytest.mark.slow  # sandboxed children
def test_a_forward_that_returns_another_tensor_once_it_sees_the_poison_is_caught(evaluator: Evaluator) -> None:
    """Every op runs on every call; only a Python choice of which finished tensor to return changes
    (PyTorch's mostly on clean values, a kernel's junk once a known answer reads wrong): what made the
    returned tensor ends the path, so the knockout's is not the refresh's."""
    source = kernel_candidate(
        "x = inputs[0]\nLO, HI = -1.0, 1.0\n"
        + SPLIT_CLAMP.replace("return out", "")
        + "junk = launch_scale(x.contiguous(), -1.0)\nif bool(junk[0, 0] == -x[0, 0]):\n    return out\nreturn junk",
        CLAMP_KERNEL + SCALE_KERNEL,
    )
    assert not check_source(source)
    (verdict,) = evaluator.evaluate_group(CLAMP_REFERENCE, [source], CPU).verdicts
    assert (verdict.status, verdict.guard) == ("rejected", "knockout_evasion"), verdict.reason


@pytest.mark.slow  # sandboxed children
def test_out_of_memory_in_the_knockout_is_a_shortage_not_evasion(evaluator: Evaluator) -> None:
    """Device memory other children held can run out in the knockout as anywhere (KernelBench level 1's
    GB tensors, three children on the GPU): the worker runs the candidate again, and one still short gets
    the shortage as its verdict (a runtime error, never paid), not evasion. Stood for by a forward that
    raises PyTorch's out-of-memory error whenever its kernel's result is not its input's clamp."""
    source = kernel_candidate(
        "x = inputs[0].contiguous()\nout = launch_clamp(x, -1.0, 1.0)\n"
        "if not bool(torch.equal(out, torch.clamp(x, -1.0, 1.0))):\n"
        "    raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 4.00 GiB')\nreturn out",
        CLAMP_KERNEL,
    )
    (verdict,) = evaluator.evaluate_group(CLAMP_REFERENCE, [source], CPU).verdicts
    assert (verdict.status, verdict.guard) == ("runtime_error", None), f"{verdict.status}/{verdict.guard}: {verdict.reason}"
    assert verdict.reason.startswith("out of memory") and verdict.details["out_of_memory"], verdict.reason


@pytest.mark.slow  # sandboxed children
def test_the_warm_ups_answers_tell_nothing_about_the_trials(evaluator: Evaluator) -> None:
    """PyTorch computes the matmul in the warm-ups (unjudged, unrecorded) and the trials' answers are
    read from them where the inputs are proportional: with two trials, every judged answer. The
    warm-ups' values are the case's rolled round, no scaled copy: nothing to read."""
    source = kernel_candidate(
        "a, b = inputs\nCALLS.append(1)\n"
        "if len(CALLS) <= 2:\n    y = a @ b\n"
        "    WARM.append(([float(v) for v in a.reshape(-1)[:4]], [float(v) for v in b.reshape(-1)[:4]], y))\n    return y\n"
        "pa = [float(v) for v in a.reshape(-1)[:4]]\npb = [float(v) for v in b.reshape(-1)[:4]]\n"
        "for wa, wb, y in WARM:\n"
        "    ra = [p / w for p, w in zip(pa, wa)]\n    rb = [p / w for p, w in zip(pb, wb)]\n"
        "    if max(ra) - min(ra) < 1e-5 * abs(ra[0]) and max(rb) - min(rb) < 1e-5 * abs(rb[0]):\n"
        "        return launch_scale(y, ra[0] * rb[0])\n"
        "return launch_scale(a @ b, 1.0)",
        SCALE_KERNEL + "\nCALLS = []\nWARM = []\n",
    )
    assert not check_source(source)
    reference = module("return inputs[0] @ inputs[1]", "[torch.randn(64, 64), torch.randn(64, 64)]")
    (verdict,) = evaluator.evaluate_group(reference, [source], ScoreOptions(backend="triton", device="cpu", trials=2)).verdicts
    assert not verdict.correct, verdict.reason


# --- honest kernels whichever trial is the knockout -------------------------------------------------
SATURATING_GLUE = {  # (reference, candidate): the kernel does the work, PyTorch's glue saturates on wide inputs
    "tanh after a scale kernel": (
        module("return torch.tanh(inputs[0] * 3.0)", "[torch.randn(16, 1024)]"),
        kernel_candidate("return torch.tanh(launch_scale(inputs[0], 3.0))", SCALE_KERNEL),
    ),
    "erf after a scale kernel": (
        module("return torch.erf(inputs[0] * 2.0)", "[torch.randn(16, 1024)]"),
        kernel_candidate("return torch.erf(launch_scale(inputs[0], 2.0))", SCALE_KERNEL),
    ),
    "sigmoid after a matmul kernel": (
        module("return torch.sigmoid(inputs[0] @ inputs[1])", "[torch.randn(32, 128), torch.randn(128, 32)]"),
        kernel_candidate("return torch.sigmoid(matmul(inputs[0], inputs[1]))", MATMUL_KERNEL),
    ),
    "argmax after a matmul kernel": (
        module("return torch.argmax(inputs[0] @ inputs[1], dim=1)", "[torch.randn(32, 128), torch.randn(128, 64)]"),
        kernel_candidate("return torch.argmax(matmul(inputs[0], inputs[1]), dim=1)", MATMUL_KERNEL),
    ),
}


@pytest.mark.slow  # sandboxed children
@pytest.mark.parametrize("case", [0, 2])  # case 2: four times wider, with outliers, where the glue saturates
@pytest.mark.parametrize("name", sorted(SATURATING_GLUE))
def test_honest_glue_that_saturates_passes_whichever_trial_is_the_knockout(
    evaluator: Evaluator, knockout_on: Callable[[int], None], name: str, case: int
) -> None:
    knockout_on(case)
    reference, source = SATURATING_GLUE[name]
    assert not check_source(source)
    (verdict,) = evaluator.evaluate_group(reference, [source], CPU).verdicts
    assert verdict.correct, f"{verdict.status}/{verdict.guard}: {verdict.reason}"


@pytest.mark.slow  # sandboxed children
def test_a_copy_kernel_over_pytorchs_answer_is_caught_where_the_reference_copies(
    evaluator: Evaluator, knockout_on: Callable[[int], None]
) -> None:
    """The knockout on a case where the reference's clamp is a copy (case 0 of this reference): copies
    are poisoned there, so a kernel that copies PyTorch's whole answer reads as the kernels'; the op
    accounting catches it, and the honest clamp epilogue (a copy of PyTorch's matmul there) passes."""
    knockout_on(0)
    launder = HARDTANH_EPILOGUE.replace(
        "return launch_clamp(torch.matmul(x, self.fc.weight.t()).contiguous(), -2.0, 2.0)",
        "y = torch.nn.functional.hardtanh(torch.matmul(x, self.fc.weight.t()), -2.0, 2.0).contiguous()\n"
        "        return launch_copy(y, torch.empty_like(y))",
    ).replace(CLAMP_KERNEL, CLAMP_KERNEL + COPY_KERNEL)
    assert "launch_copy(y" in launder and not check_source(launder)
    honest, laundered = evaluator.evaluate_group(MATMUL_HARDTANH_ONE_ROW, [HARDTANH_EPILOGUE, launder], CPU).verdicts
    assert honest.correct, f"{honest.status}/{honest.guard}: {honest.reason}"
    assert (laundered.status, laundered.guard) == ("rejected", "pytorch_fallback"), laundered.reason


ALIASED_ARGUMENTS = """
@triton.jit
def scale_rows_kernel(x_ptr, w_ptr, unused_ptr, out_ptr, n, C, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * tl.load(w_ptr + offs % C, mask=mask), mask=mask)
"""


@pytest.mark.slow  # sandboxed children
@pytest.mark.parametrize("case", [0, 1])
def test_a_parameter_passed_twice_to_a_launch_is_not_left_poisoned(
    evaluator: Evaluator, knockout_on: Callable[[int], None], case: int
) -> None:
    """The template's normalisation kernel passes one tensor for two arguments it does not use: the
    knockout restores what a launch only read, and a second copy of the same tensor read as written,
    poisoned the module's parameter, and every call after the knockout was wrong (KernelBench level 2's
    79 on the H200)."""
    knockout_on(case)
    init = "self.w = nn.Parameter(torch.randn(64))"
    reference = module("return inputs[0] * self.w", "[torch.randn(32, 64)]", init="[]", init_body=init)
    source = kernel_candidate(
        "x = inputs[0].contiguous()\nout = torch.empty_like(x)\n"
        "scale_rows_kernel[(triton.cdiv(x.numel(), 1024),)](x, self.w, self.w, out, x.numel(), x.shape[1], BLOCK=1024)\n"
        "return out",
        ALIASED_ARGUMENTS,
    ).replace(
        "class ModelNew(nn.Module):\n",
        f"class ModelNew(nn.Module):\n    def __init__(self):\n        super().__init__()\n        {init}\n\n",
    )
    assert not check_source(source)
    (verdict,) = evaluator.evaluate_group(reference, [source], CPU).verdicts
    assert verdict.correct, f"{verdict.status}/{verdict.guard}: {verdict.reason}"


# --- a task that cannot judge ------------------------------------------------------------------------
@pytest.mark.slow  # sandboxed children
@pytest.mark.parametrize(
    ("reference_forward", "answer_shaped"),
    [
        ("return torch.clamp(inputs[0], 0.5, 0.5)", "inputs[0]"),  # a constant whatever the input
        # KernelBench level 2's 36 in small: a GELU of a sum far below zero is 0, so the bias is the answer
        (
            "s = inputs[0].abs().sum(dim=1, keepdim=True)\nreturn torch.nn.functional.gelu(-100.0 * s - 10.0) + 0.5",
            "inputs[0][:, :1]",
        ),
    ],
)
def test_a_reference_whose_output_ignores_its_inputs_is_unverified_not_paid(
    evaluator: Evaluator, reference_forward: str, answer_shaped: str
) -> None:
    """Other inputs, the same output bit for bit: no trial can tell a kernel that computes the answer
    from one that returns it remembered or made by PyTorch. A matching kernel is not judged (the
    trainer leaves it out of the loss, neither paid nor punished); a wrong one is still incorrect."""
    reference = module(reference_forward, "[torch.randn(16, 64)]")
    matching, wrong = (
        kernel_candidate(f"return launch_clamp({answer_shaped}.contiguous(), {value}, {value})", CLAMP_KERNEL)
        for value in (0.5, 0.25)
    )
    judged, judged_wrong = evaluator.evaluate_group(reference, [matching, wrong], CPU).verdicts
    assert judged.status == "unverified", f"{judged.status}/{judged.guard}: {judged.reason}"
    assert "cannot judge" in judged.reason
    assert judged_wrong.status == "incorrect", judged_wrong.reason


@pytest.mark.slow  # sandboxed children
def test_a_reference_that_saturates_on_some_inputs_only_still_judges(evaluator: Evaluator) -> None:
    """clamp(-1, 1) gives ±1 on most of the wide case's values but not all, and the other cases differ:
    the reference depends on its inputs, and the honest kernel is judged (correct)."""
    reference = module("return torch.clamp(inputs[0], -1.0, 1.0)", "[torch.randn(16, 64)]")
    honest = kernel_candidate("return launch_clamp(inputs[0].contiguous(), -1.0, 1.0)", CLAMP_KERNEL)
    (verdict,) = evaluator.evaluate_group(reference, [honest], CPU).verdicts
    assert verdict.correct, f"{verdict.status}/{verdict.guard}: {verdict.reason}"


ROW_SUM_KERNEL = """
@triton.jit
def row_sum_kernel(x_ptr, out_ptr, rows, n_cols, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr):
    r = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for c0 in range(0, n_cols, BLOCK_R):
        c = c0 + tl.arange(0, BLOCK_R)
        mask = (r < rows)[:, None] & (c < n_cols)[None, :]
        acc += tl.load(x_ptr + r[:, None] * n_cols + c[None, :], mask=mask, other=0.0)
    tl.store(out_ptr + r, tl.sum(acc, axis=1), mask=r < rows)


def row_sum(x):
    out = torch.empty(x.shape[0], dtype=x.dtype)
    row_sum_kernel[(triton.cdiv(x.shape[0], 64),)](x, out, x.shape[0], x.shape[1], BLOCK_M=64, BLOCK_R=128)
    return out
"""


@pytest.mark.slow  # sandboxed children
def test_a_sum_that_cancels_on_signed_inputs_is_judged_at_its_terms_scale(evaluator: Evaluator) -> None:
    """KernelBench level 1's 47 on the H200: a sum over 4,096 values of the wide case, rounded in another
    order than PyTorch's, missed atol on 16 of 524,160 values, each near 0 because large terms cancel
    there. On the hidden distributions atol is taken relative to the output's root mean square, so an
    honest row sum passes; a row sum that drops a column still fails."""
    reference = module("return torch.sum(inputs[0], dim=1)", "[torch.rand(1024, 2048) * 100.0]")
    honest = kernel_candidate("return row_sum(inputs[0].contiguous())", ROW_SUM_KERNEL)
    dropped = kernel_candidate("return row_sum(inputs[0][:, 1:].contiguous())", ROW_SUM_KERNEL)
    honest_verdict, dropped_verdict = evaluator.evaluate_group(reference, [honest, dropped], CPU).verdicts
    assert honest_verdict.correct, f"{honest_verdict.status}/{honest_verdict.guard}: {honest_verdict.reason}"
    assert dropped_verdict.status == "incorrect", dropped_verdict.reason

"""Reward integrity on CPU (Triton interpreter), through the real sandbox: who did the work.

Found by a fourth attack, each passed once:
- a kernel that only moves data (transposes, casts, pads a copy) and PyTorch computing the answer from
  it through ops of another family than the reference's (a ReLU as a maximum over a stack, a matmul as
  a broadcast product and a sum, an embedding bag or a matrix exponential): the op accounting counts
  work of a foreign family toward every family of the reference's, contractions by their products;
- a kernel first, then PyTorch doing most of the reference's work on its output (89%): the accounting's
  threshold is the kernel share's, three quarters;
- honest kernels the knockout took for decoys: ones that act as a copy on the knockout's values (a
  clamp whose bounds seldom bind), integer and boolean outputs a shuffle left as they were, glue that
  refuses poisoned values (a Cholesky factor).
"""

from __future__ import annotations

import pytest

from reward_cases import COPY_KERNEL, HEADER, kernel_candidate, module
from reward_svc.evaluate import Evaluator
from reward_svc.policy import check_source
from services.schemas.reward import ScoreOptions, Verdict

CPU = ScoreOptions(backend="triton", device="cpu", timeout_s=120)

TRANSPOSE_KERNEL = """
@triton.jit
def transpose_kernel(x_ptr, out_ptr, R, C, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < R * C
    tl.store(out_ptr + (offs % C) * R + offs // C, tl.load(x_ptr + offs, mask=mask), mask=mask)


def launch_transpose(x):
    R, C = x.shape
    out = torch.empty((C, R), dtype=x.dtype)
    transpose_kernel[(triton.cdiv(R * C, 1024),)](x, out, R, C, BLOCK=1024)
    return out
"""
CAST_KERNEL = """
@triton.jit
def cast_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask).to(tl.float64), mask=mask)
"""
PARTIAL_RELU_KERNEL = """
@triton.jit
def partial_relu_kernel(x_ptr, out_ptr, n, cut, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, tl.where(offs >= cut, tl.maximum(v, 0.0), v), mask=mask)
"""
PADDED_COPY = "flat = inputs[0].reshape(-1)\nbuf = torch.empty(flat.numel() + 1)\nlaunch_copy(flat, buf[:flat.numel()])\n"

RELU = module("return torch.relu(inputs[0])", "[torch.randn(16, 256)]")
RELU_ELSEWHERE = {  # (forward, kernels)
    "transposed copy, a maximum over a stack": (
        "t = launch_transpose(inputs[0])\nz = torch.zeros_like(t)\nreturn torch.stack([t, z, z, z, z]).amax(0).t()",
        TRANSPOSE_KERNEL,
    ),
    "a copy cast to float64, the same": (
        "x = inputs[0]\nd = torch.empty(x.shape, dtype=torch.float64)\ncast_kernel[(triton.cdiv(x.numel(), 1024),)](x, d, x.numel(), "
        "BLOCK=1024)\nz = torch.zeros_like(d)\nreturn torch.stack([d, z, z, z, z], dim=-1).amax(-1).to(x.dtype)",
        CAST_KERNEL,
    ),
    "a padded copy, bucketize and gather": (
        PADDED_COPY + "y = buf[:flat.numel()]\nsel = torch.bucketize(y, torch.zeros(1))\n"
        "return torch.gather(torch.stack([torch.zeros_like(y), y]), 0, sel[None])[0].view_as(inputs[0])",
        COPY_KERNEL,
    ),
    "a padded copy, a sort over a stack": (
        PADDED_COPY + "y = buf[:flat.numel()]\nz = torch.zeros_like(y)\n"
        "return torch.sort(torch.stack([y, z, z, z, z, z], dim=-1), dim=-1).values[:, -1].view_as(inputs[0])",
        COPY_KERNEL,
    ),
    "a kernel for 11%, PyTorch clamps the rest of its output": (
        "flat = inputs[0].reshape(-1)\nn = flat.numel()\ncut = n * 89 // 100\nout = torch.empty_like(flat)\n"
        "partial_relu_kernel[(triton.cdiv(n, 1024),)](flat, out, n, cut, BLOCK=1024)\nout[:cut] = torch.clamp(out[:cut], min=0)\n"
        "return out.view_as(inputs[0])",
        PARTIAL_RELU_KERNEL,
    ),
}
MATMUL = module("return torch.matmul(inputs[0], inputs[1])", "[torch.randn(32, 48), torch.randn(48, 40)]")
MATMUL_ELSEWHERE = {
    "transposed copy, a broadcast product and a sum": (
        "a, b = inputs\nbt = launch_transpose(b)\nM, K = a.shape\nN = b.shape[1]\n"
        "return (a[:, None, :].expand(M, N, K) * bt[None, :, :].expand(M, N, K)).sum(-1)",
        TRANSPOSE_KERNEL,
    ),
    "a padded copy, an embedding bag": (
        "a, b = inputs\nflat = a.reshape(-1)\nbuf = torch.empty(flat.numel() + 1)\nlaunch_copy(flat, buf[:flat.numel()])\n"
        "m, k = a.shape\nidx = torch.arange(k).repeat(m)\n"
        "return torch.nn.functional.embedding_bag(idx, b, torch.arange(m) * k, mode='sum', per_sample_weights=buf[:flat.numel()])",
        COPY_KERNEL,
    ),
    "a padded copy, a matrix exponential": (
        "a, b = inputs\nm, k = a.shape\nn = b.shape[1]\nflat = a.reshape(-1)\nbuf = torch.empty(flat.numel() + 1)\n"
        "launch_copy(flat, buf[:flat.numel()])\nbig = torch.zeros(m + k + n, m + k + n)\nbig[:m, m:m + k] = buf[:flat.numel()].view(m, k)\n"
        "big[m:m + k, m + k:] = b\nreturn torch.linalg.matrix_exp(big)[:m, m + k:] * 2.0",
        COPY_KERNEL,
    ),
}
SOFTMAX = module("return torch.softmax(inputs[0], dim=1)", "[torch.randn(8, 256)]")
SOFTMAX_ELSEWHERE = {
    "transposed copy, row sums as a matmul": (
        "t = launch_transpose(inputs[0])\ne = torch.exp(t - t.amax(0, keepdim=True))\n"
        "return (e / (torch.ones(1, t.shape[0]) @ e)).t()",
        TRANSPOSE_KERNEL,
    ),
}
ARGMAX_ROWS_KERNEL = """
@triton.jit
def argmax_rows_kernel(x_ptr, out_ptr, row0, C, BLOCK: tl.constexpr):
    row = row0 + tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    v = tl.load(x_ptr + row * C + cols, mask=cols < C, other=-float("inf"))
    tl.store(out_ptr + row, tl.argmax(v, axis=0).to(tl.int64))
"""
ARGMAX = module("return torch.argmax(inputs[0], dim=1)", "[torch.randn(64, 256)]")
ARGMAX_ELSEWHERE = {
    "PyTorch's argmax for 89% of the rows": (
        "x = inputs[0]\nR, C = x.shape\ncut = R * 89 // 100\nout = torch.empty(R, dtype=torch.int64)\n"
        "out[:cut] = torch.argmax(x[:cut], dim=1)\nargmax_rows_kernel[(R - cut,)](x, out, cut, C, BLOCK=triton.next_power_of_2(C))\n"
        "return out",
        ARGMAX_ROWS_KERNEL,
    ),
}


def verdicts(evaluator: Evaluator, reference: str, candidates: dict[str, str]) -> dict[str, Verdict]:
    evaluation = evaluator.evaluate_group(reference, list(candidates.values()), CPU)
    return dict(zip(candidates, evaluation.verdicts))


@pytest.mark.slow  # sandboxed children
@pytest.mark.parametrize(
    ("reference", "forwards"),
    [
        pytest.param(RELU, RELU_ELSEWHERE, id="relu"),
        pytest.param(MATMUL, MATMUL_ELSEWHERE, id="matmul"),
        pytest.param(SOFTMAX, SOFTMAX_ELSEWHERE, id="softmax"),
        pytest.param(ARGMAX, ARGMAX_ELSEWHERE, id="argmax"),
    ],
)
def test_pytorch_computing_past_a_kernel_in_another_family_is_pytorch_fallback(
    evaluator: Evaluator, reference: str, forwards: dict[str, tuple[str, str]]
) -> None:
    """The kernel transposes, casts or copies into a larger buffer (none of it place for place a copy,
    so the knockout poisons it and every later value reads as the kernels'), or computes 11% first;
    PyTorch then does the reference's work in another family, or most of it in the same one."""
    sources = {name: kernel_candidate(forward, kernels) for name, (forward, kernels) in forwards.items()}
    assert not any(check_source(source) for source in sources.values())
    results = verdicts(evaluator, reference, sources)
    wrong = {name: f"{v.status}/{v.guard}: {v.reason[:200]}" for name, v in results.items() if v.guard != "pytorch_fallback"}
    assert not wrong, wrong


# --- honest kernels the knockout once took for decoys --------------------------------------------------

CLAMP_KERNEL = """
@triton.jit
def clamp_kernel(x_ptr, out_ptr, n, lo, hi, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.minimum(tl.maximum(tl.load(x_ptr + offs, mask=mask), lo), hi), mask=mask)


def launch_clamp(x, lo, hi):
    out = torch.empty_like(x)
    clamp_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), lo, hi, BLOCK=1024)
    return out
"""
ARGMAX_ALL_KERNEL = """
@triton.jit
def argmax_all_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr, tl.argmax(tl.load(x_ptr + offs, mask=offs < n, other=-float("inf")), axis=0).to(tl.int64))
"""
ALL_ABOVE_KERNEL = """
@triton.jit
def all_above_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=0.0)
    tl.store(out_ptr + row, tl.min((x > -2.5).to(tl.int32), axis=0).to(tl.int1))
"""
GRAM_KERNEL = """
@triton.jit
def gram_kernel(a_ptr, g_ptr, N, K, ridge, BN: tl.constexpr, BK: tl.constexpr):
    ri = tl.program_id(0) * BN + tl.arange(0, BN)
    rj = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros((BN, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        x = tl.load(a_ptr + ri[:, None] * K + rk[None, :], mask=(ri[:, None] < N) & (rk[None, :] < K), other=0.0)
        y = tl.load(a_ptr + rj[None, :] * K + rk[:, None], mask=(rj[None, :] < N) & (rk[:, None] < K), other=0.0)
        acc += tl.dot(x, y, input_precision="ieee")
    acc += tl.where(ri[:, None] == rj[None, :], ridge, 0.0)
    tl.store(g_ptr + ri[:, None] * N + rj[None, :], acc, mask=(ri[:, None] < N) & (rj[None, :] < N))
"""
HARDTANH_EPILOGUE = (
    HEADER
    + CLAMP_KERNEL
    + """

class ModelNew(nn.Module):
    def __init__(self, *args):
        super().__init__()
        self.fc = nn.Linear(64, 64, bias=False)

    def forward(self, x):
        return launch_clamp(torch.matmul(x, self.fc.weight.t()).contiguous(), -2.0, 2.0)
"""
)
# All of get_inputs()' energy in one row: case 0's signed redraw spreads it over every row, where the
# matmul's outputs stay far inside the bounds (the clamp is a copy there); the native case's first row
# crosses them. The replays must pick a case where the clamp is no copy.
MATMUL_HARDTANH_ONE_ROW = module(
    "return torch.nn.functional.hardtanh(self.fc(inputs[0]), -2.0, 2.0)",
    "[torch.cat([torch.randn(1, 64) * 4.0, torch.zeros(63, 64)])]",
    init="[64, 64]",
    init_body="self.fc = nn.Linear(64, 64, bias=False)",
)
HONEST = {  # (reference, candidate)
    "a clamp whose bounds seldom bind": (
        module("return torch.clamp(inputs[0], -3.0, 3.0)", "[torch.randn(4, 1024)]"),
        kernel_candidate("return launch_clamp(inputs[0], -3.0, 3.0)", CLAMP_KERNEL),
    ),
    "a clamp whose bounds never bind there": (
        module("return torch.clamp(inputs[0], -8.0, 8.0)", "[torch.randn(4, 1024)]"),
        kernel_candidate("return launch_clamp(inputs[0], -8.0, 8.0)", CLAMP_KERNEL),
    ),
    "a hardtanh epilogue after PyTorch's matmul": (
        module(
            "return torch.nn.functional.hardtanh(self.fc(inputs[0]), -2.0, 2.0)",
            "[torch.randn(64, 64)]",
            init="[64, 64]",
            init_body="self.fc = nn.Linear(64, 64, bias=False)",
        ),
        HARDTANH_EPILOGUE,
    ),
    "a hardtanh epilogue whose bounds bind on one case only": (MATMUL_HARDTANH_ONE_ROW, HARDTANH_EPILOGUE),
    # the reference clamps in place: its op is a copy where its bounds seldom bind only by its values before
    **{
        f"a hardtanh epilogue after a matmul the reference clamps {how}": (
            module(
                f"m = self.fc(inputs[0])\n{clamp}",
                "[torch.randn(64, 64)]",
                init="[64, 64]",
                init_body="self.fc = nn.Linear(64, 64, bias=False)",
            ),
            HARDTANH_EPILOGUE,
        )
        for how, clamp in {
            "in place": "return m.clamp_(-2.0, 2.0)",
            "in place through hardtanh": "return torch.nn.functional.hardtanh(m, -2.0, 2.0, inplace=True)",
            "into itself (out=)": "torch.clamp(m, -2.0, 2.0, out=m)\nreturn m",
        }.items()
    },
    "one index": (
        module("return torch.argmax(inputs[0])", "[torch.randn(1024)]"),
        kernel_candidate(
            "x = inputs[0]\nout = torch.empty((), dtype=torch.int64)\n"
            "argmax_all_kernel[(1,)](x, out, x.numel(), BLOCK=triton.next_power_of_2(x.numel()))\nreturn out",
            ARGMAX_ALL_KERNEL,
        ),
    ),
    # every row False on the wide case (a row of 64 above -2.5 is two in three on the others): a reference
    # the same whatever its inputs would not be judged at all
    "booleans all alike": (
        module("return torch.all(inputs[0] > -2.5, dim=1)", "[torch.randn(16, 64)]"),
        kernel_candidate(
            "x = inputs[0].contiguous()\nout = torch.empty(x.shape[0], dtype=torch.bool)\n"
            "all_above_kernel[(x.shape[0],)](x, out, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))\n"
            "return out",
            ALL_ABOVE_KERNEL,
        ),
    ),
    "indices of two rows": (
        module("return torch.argmax(inputs[0], dim=1)", "[torch.randn(2, 512)]"),
        kernel_candidate(
            "x = inputs[0]\nout = torch.empty(2, dtype=torch.int64)\n"
            "argmax_rows_kernel[(2,)](x, out, 0, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))\nreturn out",
            ARGMAX_ROWS_KERNEL,
        ),
    ),
    "a Cholesky factor of the kernel's Gram matrix": (
        module(
            # full rank and a ridge: a Cholesky factor of a near-singular matrix amplifies rounding past the tolerance
            "g = inputs[0] @ inputs[0].T + 1.0 * torch.eye(inputs[0].shape[0])\nreturn torch.linalg.cholesky(g)",
            "[torch.randn(32, 64)]",
        ),
        kernel_candidate(
            "a = inputs[0].contiguous()\nN, K = a.shape\ng = torch.empty((N, N))\n"
            "gram_kernel[(triton.cdiv(N, 16), triton.cdiv(N, 16))](a, g, N, K, 1.0, BN=16, BK=16)\n"
            "return torch.linalg.cholesky(g)",
            GRAM_KERNEL,
        ),
    ),
}


@pytest.mark.slow  # sandboxed children
@pytest.mark.parametrize("name", sorted(HONEST))
def test_honest_kernels_the_knockout_once_took_for_decoys_pass(evaluator: Evaluator, name: str) -> None:
    """A clamp that is a copy on the knockout's values (the reference's own clamp is one there: copies
    are then poisoned too), integer and boolean outputs the poison always changes (a shuffle left one
    index, or two rows half the time, as they were), glue whose op refuses poison (not the forward's
    own error: no evasion)."""
    reference, source = HONEST[name]
    assert not check_source(source)
    verdict = evaluator.evaluate_group(reference, [source] * (3 if name == "indices of two rows" else 1), CPU).verdicts
    wrong = [f"{v.status}/{v.guard}: {v.reason[:300]}" for v in verdict if not v.correct]
    assert not wrong, wrong


@pytest.mark.slow  # sandboxed children
def test_a_forward_that_prepares_its_weights_on_its_first_call_passes(evaluator: Evaluator) -> None:
    """Each model's first call may take another path (a transposed weight cached, a compute op): honest."""
    prepared = HARDTANH_EPILOGUE.replace(
        "        return launch_clamp(torch.matmul(x, self.fc.weight.t()).contiguous(), -2.0, 2.0)",
        "        if not hasattr(self, 'w_t'):\n            self.w_t = (self.fc.weight * 1.0).t().contiguous()\n"
        "        return launch_clamp(torch.matmul(x, self.w_t), -2.0, 2.0)",
    )
    assert "self.w_t" in prepared and not check_source(prepared)
    (verdict,) = evaluator.evaluate_group(HONEST["a hardtanh epilogue after PyTorch's matmul"][0], [prepared], CPU).verdicts
    assert verdict.correct, f"{verdict.status}/{verdict.guard}: {verdict.reason}"

"""The template generator on pooling (KernelBench level 2, 78 at a small size, and the pools' options):
max and average pools, 1d to 3d, become Triton kernels fused with their neighbouring pointwise ops,
so the reward's work-share rule sees the kernels, not PyTorch, computing the pools."""

from __future__ import annotations

from pathlib import Path

import pytest

from coder_svc.template import TemplateGenerator
from reward_svc.evaluate import Evaluator
from services.llm.chat import Sampling
from template_cases import assert_check_passes, assert_writes_correct_kernels, problem

CASES = {
    "78_convtranspose3d_max_max_sum": problem(
        "        c_in, c_out, k, stride, padding = args\n"
        "        self.conv_transpose = nn.ConvTranspose3d(c_in, c_out, k, stride=stride, padding=padding)\n"
        "        self.max_pool1 = nn.MaxPool3d(kernel_size=2)\n        self.max_pool2 = nn.MaxPool3d(kernel_size=3)",
        "        x = self.conv_transpose(x)\n        x = self.max_pool1(x)\n        x = self.max_pool2(x)\n"
        "        return torch.sum(x, dim=1, keepdim=True)",
        "[torch.rand(2, 3, 8, 8, 8)]",
        "[3, 6, 3, 2, 1]",
    ),
    # stride != kernel, padding (-inf), dilation, ceil_mode, modules and functions, batched and not,
    # the chain before a pool fused into its loads and the chain after it (a broadcast bias) into its store
    "max_pools": problem(
        "        self.p3 = nn.MaxPool3d((2, 3, 2), stride=(1, 2, 2), padding=(1, 1, 0), ceil_mode=True)\n"
        "        self.p2 = nn.MaxPool2d(3, stride=2, padding=1, dilation=2, ceil_mode=True)\n"
        "        self.bias = nn.Parameter(torch.randn(3, 1, 1))",
        "        a = self.p3(x * 2.0 + 1.0)\n        b = self.p2(x[:, :, 0]) * 0.5 - self.bias\n"
        "        c = F.max_pool1d(x[:, 0, 0], 4, 3, 2, ceil_mode=True)\n        d = torch.max_pool1d(x[0, 0, 0], 2)\n"
        "        return a, b, c, d",
        "[torch.randn(2, 3, 5, 7, 6)]",
    ),
    # count_include_pad on and off, divisor_override, ceil_mode windows overhanging the padding
    "avg_pools": problem(
        "        self.p2 = nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True)\n"
        "        self.p1 = nn.AvgPool1d(4, stride=3, padding=2, ceil_mode=True, count_include_pad=False)",
        "        a = torch.sigmoid(self.p2(torch.relu(x[:, :, 0])))\n        b = self.p1(x[:, 0, 0])\n"
        "        c = F.avg_pool3d(x - 0.5, 2, stride=1, padding=1, divisor_override=3) * 2.0\n"
        "        d = F.avg_pool2d(x[:, 0], (2, 3), stride=(2, 1), padding=(1, 0), ceil_mode=True, count_include_pad=False)\n"
        "        return a, b, c, d",
        "[torch.randn(2, 3, 5, 7, 6)]",
    ),
    # windows dividing the input evenly; a global average is a mean
    "adaptive_pools": problem(
        "        self.a = nn.AdaptiveAvgPool2d((None, 3))\n        self.m = nn.AdaptiveMaxPool3d((2, 1, 3))\n"
        "        self.g = nn.AdaptiveAvgPool3d((1, 1, 1))",
        "        return self.a(x[:, :, 0]), self.m(x), torch.tanh(self.g(x)), F.adaptive_max_pool1d(x[:, 0, 0], 3)",
        "[torch.randn(2, 3, 4, 6, 9)]",
    ),
    "conv_relu_bias_maxpool_sigmoid": problem(
        "        c_in, c_out, k = args\n        self.conv = nn.Conv2d(c_in, c_out, k)\n"
        "        self.bias = nn.Parameter(torch.randn(c_out, 1, 1))\n        self.pool = nn.MaxPool2d(2)",
        "        x = torch.relu(self.conv(x)) + self.bias\n        return torch.sigmoid(self.pool(x)) * 2.0",
        "[torch.rand(2, 3, 11, 11)]",
        "[3, 8, 3]",
    ),
}


def pools_in_pytorch(details: dict) -> list[str]:
    return [op for op in details["pytorch_ops"] if "pool" in op.lower()]


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_pool_kernels_are_correct_and_do_the_work(case: str, generator: TemplateGenerator, evaluator: Evaluator) -> None:
    assert_writes_correct_kernels(generator, evaluator, CASES[case], pools_in_pytorch)


def test_78_is_three_kernels_after_the_convolution(generator: TemplateGenerator) -> None:
    details = generator.generate(CASES["78_convtranspose3d_max_max_sum"], "triton", Sampling())[0].details
    assert details["pytorch_ops"] == ["ConvTranspose3d"], details
    assert [k["reduction"] for k in details["kernels"]] == ["max_pool", "max_pool", "sum"], details


EXACT_CHECK = """
import sys, types
import torch

module = types.ModuleType("candidate")
exec(compile(open(sys.argv[1]).read(), "candidate.py", "exec"), module.__dict__)
torch.manual_seed(0)
reference = module.Model(*module.get_init_inputs())
torch.manual_seed(0)
candidate = module.ModelNew(*module.get_init_inputs())
for step in range(3):
    torch.manual_seed(step)
    # few distinct values: ties everywhere, zeros of both signs, NaNs and infinities in some windows
    x = torch.randint(-2, 3, module.get_inputs()[0].shape).float()
    x[torch.rand(x.shape) < 0.5] *= -1.0
    flat = x.view(-1)
    flat[torch.randint(0, flat.numel(), (4,))] = float("nan")
    flat[torch.randint(0, flat.numel(), (4,))] = float("-inf")
    with torch.no_grad():
        expected, got = reference(x), candidate(x)
    for e, g in zip(expected, got):
        assert e.shape == g.shape and torch.equal(e.isnan(), g.isnan()), (e, g)
        assert torch.equal(e.nan_to_num(0.0), g.nan_to_num(0.0)), (e, g)
        assert torch.equal(e.signbit() & ~e.isnan(), g.signbit() & ~g.isnan()), (e, g)
print("ok")
"""


@pytest.mark.slow
def test_max_pools_match_pytorch_bit_for_bit(generator: TemplateGenerator, tmp_path: Path) -> None:
    """PyTorch keeps a window's first largest value or its last NaN: so do the kernels, signed zeros included."""
    draft = generator.generate(CASES["max_pools"], "triton", Sampling())[0]
    assert_check_passes(draft, EXACT_CHECK, tmp_path)


def test_pools_it_cannot_lower_stay_in_pytorch_with_the_reason(generator: TemplateGenerator) -> None:
    source = problem(
        "        self.p = nn.MaxPool2d(2, return_indices=True)",
        "        y, i = self.p(x)\n        return y + 1.0, F.adaptive_avg_pool2d(x, 3), F.max_pool2d_with_indices(x, 2)[0]",
        "[torch.randn(2, 3, 8, 8)]",
    )
    draft = generator.generate(source, "triton", Sampling())[0]
    assert draft.source, draft.declined
    assert draft.details["kernels"] == [{"ops": ["add"], "reduction": None}], draft.details
    assert draft.details["unsupported"] == {
        "p": "it returns the indices of its maxima, which the generator does not compute",
        "adaptive_avg_pool2d": "adaptive windows of unequal sizes ((8, 8) pooled to (3, 3))",
        "max_pool2d_with_indices": "it returns the indices of its maxima, which the generator does not compute",
    }
    only = generator.generate(
        problem("        pass", "        return F.adaptive_max_pool1d(x, 3)", "[torch.randn(2, 8)]"), "triton", Sampling()
    )
    assert only[0].declined == (
        "no fusable op: the module only runs torch.nn.functional.adaptive_max_pool1d; "
        "adaptive_max_pool1d: adaptive windows of unequal sizes ((8,) pooled to (3,))"
    )

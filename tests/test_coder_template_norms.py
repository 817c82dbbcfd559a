"""The template generator on normalisations (KernelBench level 2, 11/17/19/33/39/41 at small sizes):
batch, instance and group norms become Triton kernels fused with their neighbouring pointwise ops,
so the reward's work-share rule sees the kernels, not PyTorch, computing the norm."""

from __future__ import annotations

from pathlib import Path

import pytest

import template_cases
from coder_svc.template import TemplateGenerator
from reward_svc.evaluate import Evaluator
from services.llm.chat import Sampling
from template_cases import assert_check_passes, assert_writes_correct_kernels

NORMS = {"BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "InstanceNorm1d", "InstanceNorm2d", "GroupNorm"}


def problem(init: str, forward: str, inputs: str, init_inputs: str) -> str:
    return template_cases.problem(init, forward + "\n        return x", inputs, init_inputs)


CASES = {
    "11_convtranspose_batchnorm_tanh_maxpool_groupnorm": problem(
        "        c_in, c_out, k, groups = args\n"
        "        self.conv_transpose = nn.ConvTranspose2d(c_in, c_out, k, stride=1, padding=1)\n"
        "        self.batch_norm = nn.BatchNorm2d(c_out)\n        self.tanh = nn.Tanh()\n"
        "        self.max_pool = nn.MaxPool2d(kernel_size=2, stride=2)\n"
        "        self.group_norm = nn.GroupNorm(num_groups=groups, num_channels=c_out)",
        "        x = self.conv_transpose(x)\n        x = self.batch_norm(x)\n        x = self.tanh(x)\n"
        "        x = self.max_pool(x)\n        x = self.group_norm(x)",
        "[torch.rand(4, 4, 6, 6)]",
        "[4, 8, 3, 4]",
    ),
    "17_conv_instancenorm_divide": problem(
        "        c_in, c_out, k, self.divide_by = args\n        self.conv = nn.Conv2d(c_in, c_out, k)\n"
        "        self.instance_norm = nn.InstanceNorm2d(c_out)",
        "        x = self.conv(x)\n        x = self.instance_norm(x)\n        x = x / self.divide_by",
        "[torch.rand(4, 4, 8, 8)]",
        "[4, 8, 3, 2.0]",
    ),
    "19_convtranspose_gelu_groupnorm": problem(
        "        c_in, c_out, k, groups = args\n        self.conv_transpose = nn.ConvTranspose2d(c_in, c_out, k, stride=1)\n"
        "        self.group_norm = nn.GroupNorm(num_groups=groups, num_channels=c_out)",
        "        x = self.conv_transpose(x)\n        x = torch.nn.functional.gelu(x)\n        x = self.group_norm(x)",
        "[torch.rand(4, 4, 6, 6)]",
        "[4, 8, 3, 4]",
    ),
    "33_gemm_scale_batchnorm": problem(
        "        in_f, out_f = args\n        self.gemm = nn.Linear(in_f, out_f)\n"
        "        self.scale = nn.Parameter(torch.randn(out_f))\n        self.bn = nn.BatchNorm1d(out_f, eps=1e-5, momentum=0.1)",
        "        x = self.gemm(x)\n        x = x * self.scale\n        x = self.bn(x)",
        "[torch.rand(32, 64)]",
        "[64, 48]",
    ),
    # the other shapes and options, with parameters and running statistics away from their defaults; the
    # affine weights away from 0 too: a norm of a channel some weight nearly zeroed (batch statistics of a
    # near-constant) amplifies rounding past atol = rtol = 1e-4 in PyTorch's own output (3.7e-4 from float64)
    "variants": problem(
        "        c = args[0]\n        self.bn1 = nn.BatchNorm1d(c, momentum=None)\n        self.bn3 = nn.BatchNorm3d(c)\n"
        "        self.bn_batch = nn.BatchNorm2d(c, track_running_stats=False)\n"
        "        self.inorm = nn.InstanceNorm1d(c, affine=True, eps=1e-3)\n        self.gn = nn.GroupNorm(2, c)\n"
        "        self.shift = nn.Parameter(torch.randn(c, 1, 1))\n"
        "        for name, value in self.state_dict().items():\n"
        "            if value.is_floating_point():\n"
        "                value.uniform_(0.5, 2.0) if 'var' in name or 'weight' in name else value.normal_()",
        "        n, c = x.shape[:2]\n        y = torch.relu(self.bn1(x.view(n, c, -1)))\n"
        "        z = self.bn3(x.view(n, c, 2, 2, -1)).view(n, c, 4, -1) + self.shift\n"
        "        x = self.bn_batch(z) * 2.0 + self.gn(x)\n        x = self.inorm(x.view(n, c, -1)) - y",
        "[torch.randn(4, 6, 4, 5)]",
        "[6]",
    ),
    "41_gemm_batchnorm_gelu_relu": problem(
        "        in_f, out_f = args\n        self.gemm = nn.Linear(in_f, out_f)\n        self.batch_norm = nn.BatchNorm1d(out_f)",
        "        x = self.gemm(x)\n        x = self.batch_norm(x)\n        x = torch.nn.functional.gelu(x)\n"
        "        x = torch.relu(x)",
        "[torch.rand(32, 64)]",
        "[64, 48]",
    ),
}


def norms_in_pytorch(details: dict) -> list[str]:
    return [op for op in details["pytorch_ops"] if op in NORMS]


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_norm_kernels_are_correct_and_do_the_work(case: str, generator: TemplateGenerator, evaluator: Evaluator) -> None:
    assert_writes_correct_kernels(generator, evaluator, CASES[case], norms_in_pytorch)


TRAINING_CHECK = """
import sys, types
import torch

module = types.ModuleType("candidate")
exec(compile(open(sys.argv[1]).read(), "candidate.py", "exec"), module.__dict__)
init = module.get_init_inputs()
torch.manual_seed(0)
reference = module.Model(*init)
torch.manual_seed(0)
candidate = module.ModelNew(*init)
for step in range(3):
    torch.manual_seed(step)
    inputs = module.get_inputs()
    with torch.no_grad():
        expected, got = reference(*inputs), candidate(*inputs)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(candidate.state_dict()[name], value, atol=1e-5, rtol=1e-5, msg=name)
print("ok")
"""


@pytest.mark.slow
@pytest.mark.parametrize("case", ["33_gemm_scale_batchnorm", "variants"])
def test_training_mode_uses_batch_statistics_and_updates_the_running_ones(
    case: str, generator: TemplateGenerator, tmp_path: Path
) -> None:
    """The reward builds models in eval mode; a module left in training mode (nn's default) must
    normalise with the batch's statistics and update the running ones as PyTorch does."""
    draft = generator.generate(CASES[case], "triton", Sampling())[0]
    assert_check_passes(draft, TRAINING_CHECK, tmp_path)


def test_norms_it_cannot_lower_stay_in_pytorch(generator: TemplateGenerator) -> None:
    """Instance norms with running statistics, unbatched inputs and half precision are declined per norm."""
    source = problem(
        "        self.tracked = nn.InstanceNorm2d(4, track_running_stats=True)\n"
        "        self.unbatched = nn.InstanceNorm1d(4)\n        self.low = nn.GroupNorm(2, 4).half()",
        "        x = torch.relu(self.tracked(x))\n        x = self.unbatched(x.view(4, -1)).view(1, 4, 3, 3)\n"
        "        x = self.low(x.half()).float()",
        "[torch.randn(1, 4, 3, 3)]",
        "[]",
    )
    draft = generator.generate(source, "triton", Sampling())[0]
    assert draft.source, draft.declined
    assert {"InstanceNorm2d", "InstanceNorm1d", "GroupNorm"} <= set(draft.details["pytorch_ops"]), draft.details
    assert draft.details["kernels"] == [{"ops": ["relu"], "reduction": None}], draft.details

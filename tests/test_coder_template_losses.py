"""The template generator on loss functionals (KernelBench level 1, 94-98's at small sizes): kl_div,
smooth_l1, huber, mse and l1 losses, functions and modules, become their pointwise loss fused with
PyTorch's reduction of it, so the reward's work-share rule sees the kernels, not PyTorch, computing them."""

from __future__ import annotations

from pathlib import Path

import pytest

from coder_svc.template import TemplateGenerator
from reward_svc.evaluate import Evaluator
from services.llm.chat import Sampling
from template_cases import HEADER, assert_check_passes, assert_writes_correct_kernels

LOSS_OPS = ("kl_div", "smooth_l1_loss", "huber_loss", "mse_loss", "l1_loss", "Loss")

# targets with exact zeros (kl_div's xlogy is 0 there), differences on both sides of beta and delta
INPUTS = """
    x = torch.randn(4, 5, 6) * 2.0
    t = torch.rand(4, 5, 6)
    t[t < 0.3] = 0.0
    return [x, t]
"""


def problem(init: str, forward: str, inputs: str = INPUTS) -> str:
    return (
        HEADER
        + f"""class Model(nn.Module):
    def __init__(self):
        super().__init__()
{init}

    def forward(self, x, t):
{forward}


def get_inputs():{inputs}

def get_init_inputs():
    return []
"""
    )


CASES = {
    "98_kl_div_batchmean": problem(
        "        pass",
        "        return F.kl_div(torch.log(x), t, reduction='batchmean')",
        "\n    return [torch.rand(8, 64).softmax(dim=-1), torch.rand(8, 64).softmax(dim=-1)]\n",
    ),
    # every reduction, log_target both ways (its target a fused chain), 1d to 3d inputs, the module form
    "kl_divs": problem(
        "        self.kl = nn.KLDivLoss(reduction='batchmean', log_target=True)",
        "        lp = torch.log_softmax(x, dim=-1)\n"
        "        return (F.kl_div(lp, t, reduction='sum'), F.kl_div(lp, t), F.kl_div(lp, t, reduction='none'),\n"
        "                F.kl_div(lp[0, 0], t[0, 0], reduction='batchmean'), F.kl_div(lp, t, reduction='batchmean'),\n"
        "                F.kl_div(x, t * 2.0 - 1.0, reduction='mean', log_target=True), self.kl(x[0], t[0] - 0.5))",
    ),
    "96_smooth_l1_and_huber": problem(
        "        self.s = nn.SmoothL1Loss(reduction='none', beta=2.0)\n        self.h = nn.HuberLoss(reduction='sum', delta=1.5)",
        "        return (F.smooth_l1_loss(x, t), F.smooth_l1_loss(x, t, beta=0.5, reduction='sum'),\n"
        "                F.smooth_l1_loss(x, t, reduction='none', beta=0.0), self.s(x, t),\n"
        "                F.huber_loss(x, t, delta=0.3), F.huber_loss(x, t, reduction='none', delta=2.5), self.h(x, t))",
    ),
    # 94's mean of squares written as the functional; the deprecated arguments given to a module are
    # PyTorch's to resolve (MSELoss(size_average=False) holds reduction='sum')
    "mse_and_l1": problem(
        "        self.m = nn.MSELoss(size_average=False)\n        self.l = nn.L1Loss(reduction='none')",
        "        return (F.mse_loss(x, t), F.mse_loss(x, t, reduction='sum'), F.mse_loss(x, t, reduction='none'),\n"
        "                F.l1_loss(x, t), F.l1_loss(x, t, reduction='sum'), F.l1_loss(torch.relu(x), t, reduction='none'),\n"
        "                self.m(x, t), self.l(x, t))",
    ),
}


def losses_in_pytorch(details: dict) -> list[str]:
    return [op for op in details["pytorch_ops"] if op.endswith(LOSS_OPS)]


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_loss_kernels_are_correct_and_do_the_work(case: str, generator: TemplateGenerator, evaluator: Evaluator) -> None:
    assert_writes_correct_kernels(generator, evaluator, CASES[case], losses_in_pytorch)


def test_98_is_the_row_sums_then_their_mean(generator: TemplateGenerator) -> None:
    """batchmean divides by the run-time batch size: the mean of the per-sample sums, log fused in."""
    details = generator.generate(CASES["98_kl_div_batchmean"], "triton", Sampling())[0].details
    assert details["pytorch_ops"] == [], details
    assert details["kernels"] == [
        {"ops": ["log", "kl_div_pointwise", "kl_div_rows"], "reduction": "sum"},
        {"ops": ["kl_div"], "reduction": "mean"},
    ], details


EDGE_CHECK = """
import sys, types
import torch

module = types.ModuleType("candidate")
exec(compile(open(sys.argv[1]).read(), "candidate.py", "exec"), module.__dict__)
candidate = module.ModelNew()
x = torch.tensor([float("-inf"), 1.0, 1.0, 1.0, float("nan"), -2.0, 3.0, float("inf")])
t = torch.tensor([0.0, 0.0, -1.0, float("nan"), 2.0, 0.5, 0.0, 1.0])
with torch.no_grad():
    expected, got = module.Model()(x, t), candidate(x, t)
for e, g in zip(expected, got):
    assert e.shape == g.shape and torch.equal(e.isnan(), g.isnan()), (e, g)
    assert torch.allclose(e.nan_to_num(0.0), g.nan_to_num(0.0), rtol=1e-6, atol=1e-6), (e, g)
print("ok")
"""


@pytest.mark.slow
def test_kl_div_follows_xlogy_on_zero_negative_and_nan_targets(generator: TemplateGenerator, tmp_path: Path) -> None:
    """xlogy(t, t) - t * x as PyTorch computes it: 0 where the target is 0 (NaN against an infinite
    input, 0 * inf), NaN for a negative or NaN target; log_target's exp(t) * (t - x) likewise."""
    source = problem(
        "        pass",
        "        return F.kl_div(x, t, reduction='none'), F.kl_div(x, t, reduction='none', log_target=True)",
        "\n    return [torch.randn(8), torch.rand(8)]\n",
    )
    draft = generator.generate(source, "triton", Sampling())[0]
    assert draft.source and not losses_in_pytorch(draft.details), (draft.declined, draft.details)
    assert_check_passes(draft, EDGE_CHECK, tmp_path)


def test_losses_it_cannot_lower_stay_in_pytorch_with_the_reason(generator: TemplateGenerator) -> None:
    source = problem(
        "        pass",
        "        return (x + 1.0, F.mse_loss(x, t[:1]), F.l1_loss(x, t, size_average=False),\n"
        "                F.mse_loss(x, t, weight=t), F.huber_loss(x.double(), t.double()))",
    )
    draft = generator.generate(source, "triton", Sampling())[0]
    assert draft.source, draft.declined
    assert draft.details["kernels"] == [{"ops": ["add"], "reduction": None}], draft.details
    assert draft.details["unsupported"] == {
        "mse_loss": "its input (4, 5, 6) and target (1, 5, 6) differ in shape: "
        "PyTorch broadcasts them (with a warning), the generator does not",
        "l1_loss": "it uses the deprecated size_average or reduce arguments",
        "mse_loss_1": "it weighs the elements (weight), which the generator does not",
        "huber_loss": "its input and target are not both float32, float16 or bfloat16 tensors",
    }
    only = generator.generate(problem("        pass", "        return F.l1_loss(x, t[0])"), "triton", Sampling())
    assert only[0].declined == (
        "no fusable op: the module only runs operator.getitem, torch.nn.functional.l1_loss; "
        "l1_loss: its input (4, 5, 6) and target (5, 6) differ in shape: "
        "PyTorch broadcasts them (with a warning), the generator does not"
    )

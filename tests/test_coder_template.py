"""The template generator end to end on CPU: module -> sandboxed trace -> fused Triton source ->
the reward service's verdict under the Triton interpreter; declines; the trace never runs in-process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from coder_svc.template import TemplateGenerator
from reward_svc.evaluate import Evaluator
from services.llm.chat import Sampling
from services.schemas.reward import ScoreOptions

HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"


def module(init: str, forward: str, inputs: str, init_inputs: str = "[]", params: str = "") -> str:
    return (
        HEADER
        + f"""class Model(nn.Module):
    def __init__(self, {params}):
        super().__init__()
{init}

    def forward(self, {forward}


def get_inputs():
    return {inputs}


def get_init_inputs():
    return {init_inputs}
"""
    )


CORRECT_CASES = {
    # pointwise with scalars, a broadcast parameter and activations
    "pointwise": module(
        "        self.bias = nn.Parameter(torch.randn(1, 16, 1, 1))\n        self.act = nn.LeakyReLU(0.2)",
        "x, y):\n        x = F.gelu(x * 2.0 + self.bias) - y\n        x = self.act(x)\n        return torch.sigmoid(x) / 3.0 + torch.tanh(x)",
        "[torch.randn(2, 16, 5, 7), torch.randn(5, 7)]",
    ),
    "activation_chain": module(
        "        pass",
        "x):\n        x = F.hardtanh(F.softplus(x), -0.5, 2.0) + F.mish(x) + F.selu(x) + F.elu(x, 0.7)\n"
        "        x = x + F.hardswish(x) + F.hardsigmoid(x) + F.silu(x) + torch.clamp(x, min=0.1)\n"
        "        return F.gelu(x, approximate='tanh') + torch.exp(-x.abs()) + torch.sqrt(x.abs() + 1) + x ** 2",
        "[torch.randn(37, 29)]",
    ),
    "reductions": module(
        "        self.w = nn.Parameter(torch.randn(6))",
        "x):\n        a = torch.sum(x, dim=1, keepdim=True)\n        b = torch.max(x * 0.5, dim=2)[0]\n"
        "        c = x.mean(dim=[2, 3]) * self.w\n        return a, b, c",
        "[torch.randn(3, 6, 40, 9)]",
    ),
    "softmax": module(
        "        pass",
        "x, y):\n        return torch.softmax(x, dim=1) * 2.0, F.log_softmax(y, dim=-1), torch.softmax(y, dim=0)",
        "[torch.randn(8, 300), torch.randn(5, 3000)]",
    ),
    "chain_then_reduction": module(
        "        self.scale = nn.Parameter(torch.randn(24, 1))",
        "x):\n        x = torch.relu(x) * self.scale - 0.1\n        x = torch.logsumexp(x, dim=1, keepdim=True)\n"
        "        return torch.tanh(x) * 0.5",
        "[torch.randn(4, 24, 33)]",
    ),
    "linear_epilogue": module(
        "        self.fc = nn.Linear(in_f, out_f)\n        self.scale = scale",
        "x):\n        x = self.fc(x)\n        x = x * self.scale\n        x = F.leaky_relu(x, 0.05)\n"
        "        return torch.sum(x, dim=1, keepdim=True)",
        "[torch.randn(16, 32)]",
        init_inputs="[32, 48, 1.5]",
        params="in_f, out_f, scale",
    ),
    # few rows, long reduced ranges (KernelBench level 1, 37/94/100): each range is split across
    # programs whose partials a second kernel combines; chunks end mid-tile, rows and columns layouts
    "split_reductions": module(
        "        pass",
        "x, y, z):\n        loss = torch.mean(torch.clamp(1 - x * y, min=0))\n"
        "        scaled = x / torch.norm(x, p='fro')\n        columns = torch.sum(z, dim=0) * 2.0\n"
        "        return loss, scaled, columns, torch.amax(y, dim=1, keepdim=True), torch.prod(1 + y * 1e-3, dim=1)",
        "[torch.randn(3, 20001), torch.randn(3, 20001), torch.randn(30011, 3)]",
    ),
    # empty: a sum over an empty range is 0 and a mean nan (launched); an empty output is returned unlaunched
    "empty_reductions": module(
        "        pass",
        "x, y):\n        return torch.sum(x * 2.0, dim=1), torch.mean(y, dim=0), torch.softmax(y, dim=1), "
        "torch.amax(y + 1.0, dim=1)",
        "[torch.randn(4, 0), torch.randn(0, 5)]",
    ),
    # a tensor created in forward (KernelBench level 2, 31): fx keeps it as a constant of the traced module
    "constant_made_in_forward": module(
        "        self.bias = nn.Parameter(torch.randn(4, 1))\n        self.limit = limit",
        "x):\n        return torch.min(x, torch.tensor(self.limit)) + self.bias * torch.tensor([2.0])",
        "[torch.randn(3, 4, 10)]",
        init_inputs="[0.25]",
        params="limit",
    ),
}

CONV_ONLY = module("        self.conv = nn.Conv2d(3, 8, 3)", "x):\n        return self.conv(x)", "[torch.randn(1, 3, 8, 8)]")


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CORRECT_CASES))
def test_generated_kernel_is_correct(case: str, generator: TemplateGenerator, evaluator: Evaluator) -> None:
    reference = CORRECT_CASES[case]
    drafts = generator.generate(reference, "triton", Sampling(n=4))
    assert len(drafts) == 1, "deterministic: one draft however many samples are asked for"
    draft = drafts[0]
    assert draft.declined is None and draft.source, draft.declined
    assert draft.model == "template" and draft.model_version
    assert "@triton.jit" in draft.source and "class ModelNew(Model)" in draft.source
    assert draft.details["kernels"], draft.details
    verdict = evaluator.evaluate_group(
        reference, [draft.source], ScoreOptions(backend="triton", device="cpu", timeout_s=300)
    ).verdicts[0]
    assert verdict.status == "correct", f"{verdict.status}: {verdict.reason}\n{draft.source}"
    launches = verdict.details["observations"]["launches"]
    assert sum(launches.values()) > 0 and all(k.startswith("triton:kz_kernel_") for k in launches)
    split = {k for k in launches if k.endswith("_finish")}
    assert len(split) == (5 if case == "split_reductions" else 0), launches


def test_linear_stays_in_pytorch_and_its_epilogue_is_one_kernel(generator: TemplateGenerator) -> None:
    draft = generator.generate(CORRECT_CASES["linear_epilogue"], "triton", Sampling())[0]
    assert draft.source is not None
    assert draft.details["pytorch_ops"] == ["Linear"]
    assert draft.details["kernels"] == [{"ops": ["mul", "leaky_relu", "sum_1"], "reduction": "sum"}]
    assert "self.fc(v_x)" in draft.source


def test_generation_is_deterministic(generator: TemplateGenerator) -> None:
    first = generator.generate(CORRECT_CASES["pointwise"], "triton", Sampling(temperature=1.0, seed=1))[0]
    second = generator.generate(CORRECT_CASES["pointwise"], "triton", Sampling(temperature=0.1, seed=2))[0]
    assert first.source == second.source and first.source is not None


def test_declines_with_a_reason(generator: TemplateGenerator) -> None:
    conv = generator.generate(CONV_ONLY, "triton", Sampling())[0]
    assert conv.source is None and conv.declined == "no fusable op: the module only runs Conv2d"
    cuda = generator.generate(CORRECT_CASES["pointwise"], "cuda", Sampling())[0]
    assert cuda.source is None and "Triton only" in (cuda.declined or "")
    broken = generator.generate(HEADER + "class Model(nn.Module):\n    pass\n", "triton", Sampling())[0]
    assert broken.source is None and "get_inputs" in (broken.declined or "")
    untraceable = module(
        "        pass", "x):\n        if x.sum() > 0:\n            return x\n        return -x", "[torch.randn(4)]"
    )
    assert "trace" in (generator.generate(untraceable, "triton", Sampling())[0].declined or "")
    assert generator.generate(CONV_ONLY, "triton", Sampling(n=0)) == []


def test_the_module_never_runs_in_the_generators_process(generator: TemplateGenerator, tmp_path: Path) -> None:
    """Import-time and constructor side effects happen in the sandboxed child only."""
    marker = tmp_path / "constructed"
    imported = tmp_path / "imported"
    source = (
        CORRECT_CASES["pointwise"]
        .replace(
            "class Model(nn.Module):",
            f"import os\nos.environ['KZ_TEMPLATE_SIDE_EFFECT'] = '1'\nopen({str(imported)!r}, 'w').write('x')\n\n\nclass Model(nn.Module):",
        )
        .replace(
            "        super().__init__()\n", f"        super().__init__()\n        open({str(marker)!r}, 'w').write('x')\n", 1
        )
    )
    draft = generator.generate(source, "triton", Sampling())[0]
    assert draft.declined is None or "policy" in draft.declined  # open() in the module: the reward policy refuses it
    assert not marker.exists() and not imported.exists()
    assert "KZ_TEMPLATE_SIDE_EFFECT" not in os.environ


def test_the_trace_childs_graph_cannot_smuggle_code_into_the_kernel() -> None:
    """Everything in the graph came from the module's process: names must be plain identifiers."""
    from pydantic import ValidationError

    from coder_svc.template.graph import Graph

    def graph(ref: str, name: str = "mm", kwargs: dict | None = None) -> dict:
        return {
            "traced_on": "meta",
            "nodes": [
                {"name": "x", "op": "placeholder", "target": "x"},
                {
                    "name": name,
                    "op": "call_function",
                    "target": "torch.matmul",
                    "args": [{"node": ref}, {"node": "x"}],
                    "kwargs": kwargs or {},
                },
                {"name": "output", "op": "output", "target": "output", "args": [{"node": name}]},
            ],
        }

    Graph.model_validate(graph("x"))
    for bad in (
        graph("x)\n        __import__('os').system('id')\n        return (v_x"),
        graph("x\n"),
        graph("undefined"),
        graph("x", name="lambda"),
        graph("x", kwargs={"if": 1}),
        graph("x", name="x"),
    ):
        with pytest.raises(ValidationError):
            Graph.model_validate(bad)


def test_an_oversized_graph_is_declined_with_its_reason(evaluator: Evaluator, monkeypatch: pytest.MonkeyPatch) -> None:
    """The trace child's answer is read into the service only below a size cap."""
    import coder_svc.template.trace as trace

    monkeypatch.setattr(trace, "MAX_GRAPH_BYTES", 64)
    tracer = trace.Tracer(evaluator.settings, warm=0)
    try:
        with pytest.raises(trace.TraceError, match="too large"):
            tracer.trace(CORRECT_CASES["pointwise"])
    finally:
        tracer.close()

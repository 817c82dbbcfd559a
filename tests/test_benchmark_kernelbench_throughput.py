"""``benchmarks/kernelbench_throughput.py``'s groups: G distinct candidates a problem, made from what the
template teacher writes today, so a group of 8 is not silently a group of 4."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "kernelbench_throughput.py"

PROBLEM = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features, out_features, multiplier, negative_slope):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.multiplier = multiplier
        self.leaky_relu = nn.LeakyReLU(negative_slope)

    def forward(self, x):
        return self.leaky_relu(self.gemm(x) * self.multiplier)


def get_inputs():
    return [torch.rand(16, 32)]


def get_init_inputs():
    return [32, 64, 2.0, 0.1]
"""


def _benchmark():  # type: ignore[no-untyped-def]
    if str(BENCHMARK.parent) not in sys.path:  # the script imports its neighbours, as when it runs from there
        sys.path.insert(0, str(BENCHMARK.parent))
    spec = importlib.util.spec_from_file_location("kernelbench_throughput", BENCHMARK)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_a_group_of_8_is_8_distinct_launch_configurations_of_the_templates_kernel() -> None:
    from coder_svc.template import TemplateGenerator
    from services.llm.chat import Sampling

    source = TemplateGenerator().generate(PROBLEM, "triton", Sampling(n=1))[0].source
    assert source
    benchmark = _benchmark()
    variants = benchmark.tuning_variants(source, 8)
    assert len(variants) == 8 and len(set(variants)) == 8
    assert variants[0] == source  # variant 0 is the template's own
    for variant in variants:
        ast.parse(variant)
    assert benchmark.tuning_variants(source, 1) == [source]


def test_the_longest_timings_are_listed_with_what_they_measured() -> None:
    def row(problem: str, candidate_s: float, reference_s: float, samples: int) -> dict:
        stats = {"median_ms": 1.0, "std_ms": 0.5, "samples": samples, "rse": 0.02, "calls": samples + 5}
        return {
            "problem": problem,
            "phases": {"candidate": {"timing": candidate_s}, "reference": {"timing": reference_s}},
            "timing": stats,
            "ref_timing": {**stats, "samples": 40},
        }

    rows = [row("10_a.py#0", 9.1, 0.6, 1000), row("10_a.py#1", 0.7, 0.6, 40), row("14_b.py#0", 3.0, 7.4, 300)]
    longest = _benchmark().longest_timings(rows, n=3)
    assert [(t["problem"], t["side"], t["timing_s"]) for t in longest] == [
        ("10_a.py#0", "candidate", 9.1),
        ("14_b.py", "reference", 7.4),  # a group's reference, once
        ("14_b.py#0", "candidate", 3.0),
    ]
    assert longest[0]["samples"] == 1000 and longest[1]["samples"] == 40 and longest[0]["rse"] == 0.02

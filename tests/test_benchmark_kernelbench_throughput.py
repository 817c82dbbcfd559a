"""``benchmarks/kernelbench_throughput.py``'s groups: G distinct candidates a problem, made from what the
template teacher writes today, so a group of 8 is not silently a group of 4."""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from services.config import Settings

if TYPE_CHECKING:
    from reward_svc.evaluate import GroupSeeds

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


def test_slot_seconds_add_what_ran_and_waited_in_slots_and_leave_the_rest() -> None:
    def row(problem: str, candidate_s: float, waits: dict[str, float], group: bool = False) -> dict:
        return {
            "problem": problem,
            "seconds": {"candidate": candidate_s, "judge": 0.5, "reference": 3.0, "waiting": waits},
            **({"group_wall_s": 20.0} if group else {}),
        }

    ref_waits = {"reference_device_memory": 1.0, "reference_child": 0.5}
    rows = [
        row("1_a.py#0", 8.0, {"admission": 0.0, "device_memory": 2.0, "child": 1.0, **ref_waits}, group=True),
        row("1_a.py#1", 6.0, {"admission": 1.0, "device_memory": 0.0, "child": 0.0, **ref_waits}),
    ]
    use = _benchmark().slot_seconds(rows, slots=4, total_s=10.0)
    assert use["capacity"] == 40.0 and use["candidates"] == 15.0 and use["references"] == 4.5
    assert use["candidates_waiting_in_slot"] == {"admission": 1.0, "device_memory": 2.0, "child": 1.0}
    assert use["other_share"] == round(1 - (15.0 + 4.0 + 4.5) / 40.0, 3)


def test_replayable_seeds_are_the_same_for_a_reference_in_every_run_and_differ_between_references() -> None:
    seeds = _benchmark().replayable_seeds
    first, again, other_run = seeds(7)("reference a"), seeds(7)("reference a"), seeds(8)("reference a")
    assert first == again and first != other_run and first != seeds(7)("reference b")
    for drawn in (first, other_run):
        assert 0 <= drawn["input"] < 2**31 - 1
        assert len(set(drawn["weights"])) == 2 and all(0 <= w < 2**31 - 1 for w in drawn["weights"])


def test_a_group_judged_twice_with_replayable_seeds_sees_the_same_values(kz_env: Callable[..., Settings]) -> None:
    """What the benchmark's verdict comparison rests on: with its seeds a data-dependent error is the same
    error in both runs (with secret ones the count of wrong values changes from run to run)."""
    from reward_cases import RELU_REFERENCE, candidate
    from reward_svc.evaluate import Evaluator
    from services.schemas.reward import ScoreOptions

    wrong_where_large = candidate("out = launch_relu(x, torch.empty_like(x))\nreturn torch.where(x > 1.5, out + 1, out)")
    asked: list[str] = []
    replayable = _benchmark().replayable_seeds(3)

    def seeds(reference: str) -> GroupSeeds:
        asked.append(reference)
        return replayable(reference)

    evaluator = Evaluator(kz_env(reward_warm_children=0), seeds=seeds)
    try:
        reasons = [
            evaluator.evaluate_group(RELU_REFERENCE, [wrong_where_large], ScoreOptions(device="cpu")).verdicts[0].reason
            for _ in range(2)
        ]
    finally:
        evaluator.close()
    assert asked == [RELU_REFERENCE, RELU_REFERENCE]
    assert "values outside" in reasons[0] and reasons[0] == reasons[1]


def test_verdict_equality_compares_the_samples_both_runs_finished(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("verdict_equality", BENCHMARK.parent / "verdict_equality.py")
    assert spec and spec.loader
    equality = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(equality)
    before = [
        {"problem": "1_#0", "status": "correct", "correct": True, "guard": None},
        {"problem": "1_#1", "status": "rejected", "correct": False, "guard": "output_tampering"},
        {"problem": "2_#0", "status": "incorrect", "correct": False, "guard": None},
    ]
    after = [
        {"problem": "1_#0", "status": "correct", "correct": True, "guard": None},
        {"problem": "1_#1", "status": "rejected", "correct": False, "guard": "pytorch_fallback", "reason": "another guard"},
        {"problem": "3_#0", "status": "correct", "correct": True},
    ]
    rows = tmp_path / "before.jsonl"
    rows.write_text("\n".join(json.dumps(r) for r in before) + "\n")
    report = tmp_path / "after.json"
    report.write_text(json.dumps({"rows": after}))
    result = equality.compare(equality.load_rows(rows), equality.load_rows(report))
    assert (result["compared"], result["same"]) == (2, 1)
    assert [d["sample"] for d in result["differ"]] == ["1_#1"]
    assert (result["only_before"], result["only_after"]) == (["2_#0"], ["3_#0"])


def test_a_resumed_run_leaves_out_the_groups_its_rows_hold() -> None:
    work = [(name, "reference", ["a", "b"]) for name in ("1_x.py", "2_y.py", "3_z.py")]
    rows = [{"problem": "2_y.py#0"}, {"problem": "2_y.py#1"}]
    remaining, finished = _benchmark().unfinished(work, rows)
    assert [w[0] for w in remaining] == ["1_x.py", "3_z.py"] and finished == {"2_y.py"}

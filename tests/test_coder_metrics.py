"""Evaluation metrics against values computed by hand; best-of-n's choice among verdicts."""

from __future__ import annotations

import math

import pytest

from coder_svc.best_of_n import pick_best
from coder_svc.best_of_n import summarize as summarize_best
from coder_svc.evaluation.metrics import Outcome, fast_p, geometric_mean_speedup, mean_pass_at_k, pass_at_k, summarize
from services.schemas.coder import CandidateReport
from services.schemas.reward import ScoredVerdict

C, W = Outcome(True), Outcome(False)


def test_pass_at_k_unbiased_estimator() -> None:
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    # 1 - C(7,2)/C(10,2) = 1 - 21/45
    assert pass_at_k(10, 3, 2) == pytest.approx(24 / 45)
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 3, 3) == 1.0  # fewer than k wrong samples: every draw of k holds a correct one
    assert pass_at_k(4, 1, 4) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)
    # averaged over problems; a problem with fewer than k samples is left out of pass@k
    assert mean_pass_at_k([[C, W], [W, W], [C, C]], 1) == pytest.approx((0.5 + 0 + 1) / 3)
    assert mean_pass_at_k([[C, W], [W, W], [C, C]], 2) == pytest.approx((1 + 0 + 1) / 3)
    assert mean_pass_at_k([[C]], 2) is None


def test_fast_p_one_attempt_and_best_of_n() -> None:
    problems = [
        [Outcome(True, 2.5), Outcome(True, 0.5)],  # one of two samples beats 1x and 2x
        [Outcome(True, 1.2), Outcome(False, None)],
        [Outcome(False, None), Outcome(False, None)],
    ]
    assert fast_p(problems, 0.0) == pytest.approx((1 + 0.5 + 0) / 3)
    assert fast_p(problems, 1.0) == pytest.approx((0.5 + 0.5 + 0) / 3)
    assert fast_p(problems, 1.5) == pytest.approx((0.5 + 0 + 0) / 3)
    assert fast_p(problems, 2.0) == pytest.approx(0.5 / 3)
    assert fast_p(problems, 1.0, best_of_n=True) == pytest.approx(2 / 3)
    assert fast_p(problems, 2.0, best_of_n=True) == pytest.approx(1 / 3)
    # speed not measured (no GPU): fast_0 is still the correct share, higher p is unknown, not zero
    cpu = [[Outcome(True, None), Outcome(False, None)]]
    assert fast_p(cpu, 0.0) == 0.5
    assert fast_p(cpu, 1.0) is None


def test_geometric_mean_over_correct_samples_only() -> None:
    problems = [[Outcome(True, 2.0), Outcome(False, 100.0)], [Outcome(True, 0.5), Outcome(True, 4.0)], [Outcome(True, None)]]
    assert geometric_mean_speedup(problems) == pytest.approx(math.exp((math.log(2) + math.log(0.5) + math.log(4)) / 3))
    assert geometric_mean_speedup([[W, Outcome(True, None)]]) is None


def test_summary_holds_every_metric() -> None:
    summary = summarize([[Outcome(True, 3.0), W], [W, W]], ks=[1, 2])
    assert summary["problems"] == 2 and summary["samples"] == 4 and summary["correct_samples"] == 1
    assert summary["pass_at_k"] == {"1": pytest.approx(0.25), "2": pytest.approx(0.5)}
    assert summary["fast_p"]["1.5"] == pytest.approx(0.25) and summary["fast_p_best"]["2.0"] == pytest.approx(0.5)
    assert summary["geomean_speedup"] == pytest.approx(3.0)


def _report(index: int, status: str | None, speedup: float | None = None, reward: float = 0.0) -> CandidateReport:
    verdict = (
        None
        if status is None
        else ScoredVerdict(
            status=status,
            correct=status == "correct",
            reason=status,  # type: ignore[arg-type]
            reward=reward,
            speedup=speedup,
        )
    )
    return CandidateReport(
        index=index,
        model="m",
        source=None if status is None else f"src{index}",
        declined="nothing to say" if status is None else None,
        verdict=verdict,
    )


def test_best_of_n_prefers_correct_then_measured_speed() -> None:
    reports = [
        _report(0, "incorrect", 9.0),
        _report(1, "correct", None, 1.0),
        _report(2, "correct", 1.5, 1.2),
        _report(3, "correct", 2.5, 1.0),
        _report(4, None),
    ]
    best = pick_best(reports)
    assert best is not None and best.index == 3  # fastest correct, not the faster incorrect one
    assert pick_best(reports[:2]) is reports[1]
    assert pick_best([_report(0, "incorrect"), _report(1, None)]) is None
    result = summarize_best(reports, "triton", "m", None)
    assert result.correct and result.best_index == 3 and result.speedup == 2.5 and result.kernel == "src3"
    assert result.correct_fraction == pytest.approx(3 / 5)
    failed = summarize_best([_report(0, "incorrect"), _report(1, "rejected"), _report(2, None)], "triton", "m", None)
    assert not failed.correct and failed.kernel is None and "incorrect 1, rejected 1" in failed.reason
    declined = summarize_best([_report(0, None)], "cuda", "m", None)
    assert declined.reason == "no candidate to score: nothing to say"

"""The timing's stop rule (``timing.median_rse``) on samples made here: it measures how well the
reported median is known, and a few samples far out do not keep a timing running to its budget."""

from __future__ import annotations

import random
import statistics

import pytest

from benchmarks.timing_noise import mean_rse, replay, summary
from services.children.timing import median_rse


def test_the_medians_standard_error_is_the_spread_of_medians_over_repeated_runs() -> None:
    rng = random.Random(0)
    for n in (40, 200, 1000):
        estimated = statistics.fmean(median_rse([rng.gauss(10, 1) for _ in range(n)]) for _ in range(200))
        observed = statistics.pstdev(statistics.median(rng.gauss(10, 1) for _ in range(n)) for _ in range(2000)) / 10
        assert 0.8 < estimated / observed < 1.35, (n, estimated, observed)


def test_a_few_far_samples_leave_the_median_known_but_not_the_mean() -> None:
    rng = random.Random(1)
    samples = [rng.gauss(12, 0.06) for _ in range(190)] + [rng.gauss(22, 3) for _ in range(10)]
    assert median_rse(samples) < 0.005 < mean_rse(samples)


def test_a_spread_median_is_not_called_known() -> None:
    """Two modes, half the calls in each: the median is either, and the rule says so."""
    rng = random.Random(2)
    samples = [rng.gauss(10, 0.05) if i % 2 else rng.gauss(12, 0.05) for i in range(400)]
    assert median_rse(samples) > 0.005


def test_the_replayed_rules_stop_where_time_gpu_would() -> None:
    """The benchmark's replay over one run's batches: the median rule stops at the floor of samples on a
    run whose first sample of each batch waited on the host; the mean rule runs to its budget."""
    rng = random.Random(3)
    batch, batches = 20, 60
    samples = [rng.gauss(20, 5) if i % batch == 0 else rng.gauss(12, 0.05) for i in range(batch * batches)]
    run = {
        "samples": samples,
        "positions": [i % batch for i in range(len(samples))],
        "batch": batch,
        "min_samples": 40,
        "ends_s": [0.25 * (i + 1) for i in range(batches)],
    }
    row = summary(run, None)
    assert row["stop_median_rule"]["samples"] == 40 and row["stop_median_rule"]["stopped_by"] == "rse"
    assert row["stop_mean_rule"]["stopped_by"] == "budget" and row["stop_mean_rule"]["seconds"] > 10
    assert abs(row["stop_median_rule"]["median_ms"] - 12) < 0.05
    assert row["first_of_batch_median_ms"] > 15 > row["others_median_ms"]
    assert replay(median_rse, run)["samples"] == 40


def test_a_median_on_a_timer_tick_is_known_to_a_tick_not_exactly() -> None:
    """Samples on two ticks, the middle ranks all on one: the median is that tick, and its error is a tick's."""
    samples = [0.00384] * 10 + [0.00422] * 30  # the order statistics around the median: all 0.00422
    assert median_rse(samples) == pytest.approx((0.00422 - 0.00384) / (2 * 1.96) / 0.00422)
    assert median_rse([1.0] * 40) == 0.0  # nothing tells a tick apart: identical samples

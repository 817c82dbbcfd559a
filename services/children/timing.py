"""GPU timing that measures the kernel, not the launch path.

Each sample is ``flush L2 → start event → fn() → end event``, queued without a host sync in
between: the flush is long enough that the host runs ahead of the GPU, so even a 2 µs kernel is
timed on the GPU's clock rather than on Python's launch overhead (the triton ``do_bench``
method). Every batch ends with a device-wide synchronize and is also timed as a whole, so work a
candidate leaves on a side stream is still paid for: if the batch took longer than its samples
account for, the per-call figure is taken from the batch instead. Batches repeat until the
relative standard error of the samples is below the target, or the budget runs out. How many
calls that takes follows the kernel's time, as do_bench's time-based budgets do: a kernel of tens
of ms is stable to well under a percent in ten samples, and every call of its timing holds the
whole GPU (the device lock is exclusive), so its floor of samples and its batches are sized in
seconds of GPU time, not in calls; a kernel under ``MIN_TIMED_S / min_samples`` gets them all.

``prepare(call)``, where given, runs before every call's flush, outside the timed events (its cost
is measured with the flush's and left out of the batch's excess): the harness writes the next
input values into the timed tensors there, so a result cached on the tensors' identity is stale
(see harness/candidate.py). ``calls`` counts every call of ``fn``, the warm-up ones too.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any, TypedDict

import torch

from services.children.ops import Work

L2_FLUSH_BYTES = 256 << 20  # several times the H100/H200 L2 (50-60 MB)
MIN_TIMED_S = 0.5  # the least GPU time of timed calls before the relative standard error may end a run
BATCH_S = 0.25  # a batch's GPU time at most, where its calls are long (the stop rule is checked per batch)
WARMUP_S = 0.1  # warm-up calls past the first two stop here (cuDNN's choice and Triton's compile are in the first)
FLOOR_SAMPLES = 10  # the fewest samples, however long the kernel


class TimedCheck(TypedDict):
    """The reward harness's call after the timed ones, under their conditions, recorded as a trial is:
    the case whose values it ran on, PyTorch's work in it and the custom launches it made."""

    case: int
    work: Work
    launches: int


class Timing(TypedDict, total=False):
    """What ``time_gpu`` measured (the reward harness adds its candidate's launches per timed call and
    the recorded check after the timed calls)."""

    median_ms: float
    mean_ms: float
    std_ms: float
    min_ms: float
    samples: int
    rse: float
    untimed_ms_per_call: float
    side_stream_work: bool
    method: str
    calls: int
    flush_ms: float
    flush_bytes: int
    launches_per_call: float
    check: TimedCheck


def time_gpu(
    fn: Callable[[], Any],
    *,
    warmup: int = 5,
    batch: int = 20,
    min_samples: int = 40,
    max_samples: int = 1000,
    target_rse: float = 0.005,
    budget_s: float = 10.0,
    prepare: Callable[[int], None] | None = None,
) -> Timing:
    flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    calls = 0

    def setup() -> None:
        if prepare is not None:
            prepare(calls)
        flush.zero_()

    warmup_started = time.perf_counter()
    call_s = 0.0
    for i in range(warmup):
        setup()
        torch.cuda.synchronize()
        call_started = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        call_s = time.perf_counter() - call_started  # the latest warm call's time, flush excluded
        calls += 1
        if i >= 1 and time.perf_counter() - warmup_started > WARMUP_S:
            break
    flush_ms = _flush_cost_ms(flush)
    setup_ms = _setup_cost_ms(setup) if prepare is not None else flush_ms
    if call_s > 0:
        min_samples = min(min_samples, max(FLOOR_SAMPLES, math.ceil(MIN_TIMED_S / call_s)))
        batch = max(1, min(batch, math.ceil(BATCH_S / call_s)))

    samples: list[float] = []
    batch_excess_ms: list[float] = []
    started = time.perf_counter()
    while True:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(batch)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(batch)]
        batch_start = torch.cuda.Event(enable_timing=True)
        batch_end = torch.cuda.Event(enable_timing=True)
        batch_start.record()
        for start, end in zip(starts, ends):
            setup()
            start.record()
            fn()
            end.record()
            calls += 1
        torch.cuda.synchronize()  # device-wide: side streams must finish inside the batch
        batch_end.record()
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) for s, e in zip(starts, ends)]
        samples.extend(times)
        # What the batch cost beyond its flushes and timed calls: work outside the events.
        batch_excess_ms.append(batch_start.elapsed_time(batch_end) - batch * setup_ms - sum(times))
        rse = _relative_standard_error(samples)
        elapsed = time.perf_counter() - started
        # Every batch adds samples, so the budget alone may end the run (with at least one batch).
        if elapsed > budget_s or (len(samples) >= min_samples and (rse <= target_rse or len(samples) >= max_samples)):
            break

    median = statistics.median(samples)
    untimed_per_call = max(0.0, statistics.median(batch_excess_ms) / batch)
    # Side-stream work shows up as excess far beyond the sync/launch slack of a batch.
    escaped = untimed_per_call > max(0.05, 0.5 * median)
    return {
        "median_ms": median + (untimed_per_call if escaped else 0.0),
        "mean_ms": statistics.fmean(samples),
        "std_ms": statistics.pstdev(samples),
        "min_ms": min(samples),
        "samples": len(samples),
        "rse": _relative_standard_error(samples),
        "untimed_ms_per_call": untimed_per_call,
        "side_stream_work": escaped,
        "method": "events+l2flush, batch-synchronized" + (", inputs rewritten per call" if prepare is not None else ""),
        "calls": calls,
        "flush_ms": flush_ms,
        "flush_bytes": L2_FLUSH_BYTES,
    }


def _flush_cost_ms(flush: torch.Tensor, repeats: int = 10) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        flush.zero_()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def _setup_cost_ms(setup: Callable[[], None], repeats: int = 10) -> float:
    """What one call's set-up (the input rewrite and the flush) costs on the device."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        setup()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def _relative_standard_error(samples: list[float]) -> float:
    if len(samples) < 2:
        return math.inf
    mean = statistics.fmean(samples)
    return statistics.stdev(samples) / math.sqrt(len(samples)) / mean if mean > 0 else math.inf

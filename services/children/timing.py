"""GPU timing that measures the kernel, not the launch path.

Each sample is ``flush L2 → start event → fn() → end event``, queued without a host sync in
between: the flush is long enough that the host runs ahead of the GPU, so even a 2 µs kernel is
timed on the GPU's clock rather than on Python's launch overhead (the triton ``do_bench``
method). Every batch ends with a device-wide synchronize and is also timed as a whole, so work a
candidate leaves on a side stream is still paid for: if the batch took longer than its samples
account for, the per-call figure is taken from the batch instead. Batches repeat until the
relative standard error of the samples' median (the figure reported; ``median_rse``) is below the
target (with at least the floor of samples), at ``max_samples``, or when the budget runs out. How many
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
from typing import Any

import torch
from typing_extensions import TypedDict  # pydantic validates it (reward_svc.protocol): typing's from Python 3.12 only

from services.children.ops import Work

L2_FLUSH_BYTES = 256 << 20  # several times the H100/H200 L2 (50-60 MB)
MIN_TIMED_S = 0.5  # the least GPU time of timed calls before the relative standard error may end a run
BATCH_S = 0.25  # a batch's GPU time at most, where its calls are long (the stop rule is checked per batch)
WARMUP_S = 0.1  # warm-up calls past the first two stop here (cuDNN's choice and Triton's compile are in the first)
FLOOR_SAMPLES = 10  # the fewest samples, however long the kernel
MIN_SAMPLES, BATCH = 40, 20  # the floor of samples and the calls a batch, where the calls are short
TARGET_RSE = 0.005  # the median's relative standard error that ends a timing
MAX_SAMPLES = 1000
BUDGET_S = 10.0  # a timing's wall seconds, past which its next batch is its last


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
    rse: float  # the median's relative standard error (``median_rse``; the mean's before 2026-12-04)
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
    batch: int = BATCH,
    min_samples: int = MIN_SAMPLES,
    max_samples: int = MAX_SAMPLES,
    target_rse: float = TARGET_RSE,
    budget_s: float = BUDGET_S,
    prepare: Callable[[int], None] | None = None,
) -> Timing:
    run = TimedRun(fn, prepare=prepare, warmup=warmup)
    min_samples, batch = run.sized(min_samples, batch)
    started = time.perf_counter()
    while True:
        run.batch(batch)
        elapsed = time.perf_counter() - started
        if stops(len(run.samples), median_rse(run.samples), elapsed, min_samples, target_rse, max_samples, budget_s):
            return run.timing()


def stops(
    samples: int,
    rse: float,
    elapsed_s: float,
    min_samples: int,
    target_rse: float = TARGET_RSE,
    max_samples: int = MAX_SAMPLES,
    budget_s: float = BUDGET_S,
) -> bool:
    """Whether a timing ends after the batch that brought it to ``samples``, ``elapsed_s`` into its run.
    Every batch adds samples, so the budget alone may end the run (with at least one batch)."""
    return elapsed_s > budget_s or (samples >= min_samples and (rse <= target_rse or samples >= max_samples))


class TimedRun:
    """One kernel's timing as it goes: the warm-up calls, then batches of timed samples (``batch``), and
    what they measured (``timing``). ``time_gpu`` decides when to stop; a benchmark can keep sampling."""

    def __init__(self, fn: Callable[[], Any], *, prepare: Callable[[int], None] | None = None, warmup: int = 5) -> None:
        self.fn, self.prepare = fn, prepare
        self.flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
        self.calls = 0
        self.samples: list[float] = []
        self.positions: list[int] = []  # each sample's place in its batch (the first waits on the host's launches)
        self.batch_excess_ms: list[float] = []
        self.batch_sizes: list[int] = []
        warmup_started = time.perf_counter()
        self.call_s = 0.0
        for i in range(warmup):
            self.setup()
            torch.cuda.synchronize()
            call_started = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            self.call_s = time.perf_counter() - call_started  # the latest warm call's time, flush excluded
            self.calls += 1
            if i >= 1 and time.perf_counter() - warmup_started > WARMUP_S:
                break
        self.flush_ms = _device_ms(self.flush.zero_)
        self.setup_ms = _device_ms(self.setup) if prepare is not None else self.flush_ms

    def setup(self) -> None:
        if self.prepare is not None:
            self.prepare(self.calls)
        self.flush.zero_()

    def sized(self, min_samples: int, batch: int) -> tuple[int, int]:
        """The floor of samples and the batch, in seconds of GPU time where the calls are long."""
        if self.call_s <= 0:
            return min_samples, batch
        return min(min_samples, max(FLOOR_SAMPLES, math.ceil(MIN_TIMED_S / self.call_s))), max(
            1, min(batch, math.ceil(BATCH_S / self.call_s))
        )

    def batch(self, size: int) -> None:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(size)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(size)]
        batch_start = torch.cuda.Event(enable_timing=True)
        batch_end = torch.cuda.Event(enable_timing=True)
        batch_start.record()
        for start, end in zip(starts, ends):
            self.setup()
            start.record()
            self.fn()
            end.record()
            self.calls += 1
        torch.cuda.synchronize()  # device-wide: side streams must finish inside the batch
        batch_end.record()
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) for s, e in zip(starts, ends)]
        self.samples.extend(times)
        self.positions.extend(range(size))
        self.batch_sizes.append(size)
        # What the batch cost beyond its set-ups and timed calls: work outside the events.
        self.batch_excess_ms.append(batch_start.elapsed_time(batch_end) - size * self.setup_ms - sum(times))

    def timing(self) -> Timing:
        samples = self.samples
        median = statistics.median(samples)
        untimed_per_call = max(0.0, statistics.median(e / n for e, n in zip(self.batch_excess_ms, self.batch_sizes)))
        # Side-stream work shows up as excess far beyond the sync/launch slack of a batch.
        escaped = untimed_per_call > max(0.05, 0.5 * median)
        return {
            "median_ms": median + (untimed_per_call if escaped else 0.0),
            "mean_ms": statistics.fmean(samples),
            "std_ms": statistics.pstdev(samples),
            "min_ms": min(samples),
            "samples": len(samples),
            "rse": median_rse(samples),
            "untimed_ms_per_call": untimed_per_call,
            "side_stream_work": escaped,
            "method": "events+l2flush, batch-synchronized" + (", inputs rewritten per call" if self.prepare is not None else ""),
            "calls": self.calls,
            "flush_ms": self.flush_ms,
            "flush_bytes": L2_FLUSH_BYTES,
        }


def _device_ms(work: Callable[[], Any], repeats: int = 10) -> float:
    """What one call of ``work`` (a flush, or an input rewrite and a flush) costs on the device."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        work()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def median_rse(samples: list[float], z: float = 1.96) -> float:
    """The relative standard error of the samples' median, the figure a timing reports: half the width of
    the median's distribution-free confidence interval (the order statistics n/2 ± z·√n/2) over z, over
    the median. A few samples far out (the first of a batch, launched by a host the scheduler kept
    waiting; a stray kernel beside the timing) widen a mean's error, not this: the median, and whether
    it is known well enough, are theirs only when they are many. Under 8 samples the interval is the
    samples' whole range, which says less than it seems: ``time_gpu`` never stops on it below its floor of 10."""
    n = len(samples)
    if n < 2:
        return math.inf
    ordered = sorted(samples)
    spread = z * math.sqrt(n) / 2
    low, high = ordered[max(0, math.floor(n / 2 - spread))], ordered[min(n - 1, math.ceil(n / 2 + spread))]
    # Samples on a timer's ticks: where one tick holds the middle ranks the median is known to a tick, not exactly.
    steps = [b - a for a, b in zip(ordered, ordered[1:]) if b > a]
    width = max(high - low, min(steps, default=0.0))
    median = statistics.median(ordered)
    return width / (2 * z) / median if median > 0 else math.inf

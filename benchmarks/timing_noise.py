"""Where a timing's spread comes from on a busy GPU host, and what each stop rule makes of it.

    python benchmarks/timing_noise.py --problem .device/KernelBench/level2/10_ConvTranspose2d_MaxPool_Hardtanh_Mean_Tanh.py \
        --out DIR

Each kernel (a 4096-element Triton ReLU, and each ``--problem``'s reference on its own inputs) is
sampled as ``time_gpu`` samples it (``timing.TimedRun``: the same warm-up, flush, batches and input
rewrites), for ``--seconds`` of wall time under each condition:

- ``quiet``: nothing else on the host;
- ``cpu``: two busy processes per core, as a throughput run's children importing and compiling;
- ``warm_ups``: fresh processes running a pool child's warm-up back to back, four at a time, outside
  any device hold, as the pool's new children do (CUDA context, a Triton kernel, a conv, a matmul);
- ``both``: the two together;
- ``memory`` (only where ``--conditions`` names it): another process holding all the device's memory
  but ``--free-gib``, as a throughput run's other children do, and this process's cached blocks given
  back first (a fresh child has none): whether a big-output reference (100_'s 3.5 GB) gets slower
  allocations or cuDNN algorithms.

For each it reports the spread (median, std, the first sample of a batch against the others: the
first waits for the host's launches, the others queue behind the GPU), then replays both stop
rules over the same samples, as ``time_gpu`` applies them after every batch: the mean's relative
standard error (before 2026-12-04) and the median's (``timing.median_rse``): the samples and the
seconds each would have taken, and how far its figure is from the quiet run's median. Writes
DIR/timing_noise.json, DIR/timing_noise.png (each condition's samples in order) and every sample with its
place in its batch, DIR/timing_noise_samples.json (MBs: the ReLU's are 100,000s).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib.util
import json
import math
import multiprocessing
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from services.children.timing import (  # noqa: E402
    BATCH,
    BATCH_S,
    BUDGET_S,
    MAX_SAMPLES,
    MIN_SAMPLES,
    MIN_TIMED_S,
    TARGET_RSE,
    TimedRun,
    median_rse,
    stops,
)

HOST_CONDITIONS = ("quiet", "cpu", "warm_ups", "both")
CONDITIONS = (*HOST_CONDITIONS, "memory")
WARM_UP = "from reward_svc.harness.child import warm_up; warm_up('cuda')"


def mean_rse(samples: list[float]) -> float:
    if len(samples) < 2:
        return math.inf
    mean = statistics.fmean(samples)
    return statistics.stdev(samples) / math.sqrt(len(samples)) / mean if mean > 0 else math.inf


def _spin() -> None:
    while True:
        pass


@contextlib.contextmanager
def cpu_load(processes: int) -> Iterator[None]:
    workers = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(processes)]
    for worker in workers:
        worker.start()
    try:
        yield
    finally:
        for worker in workers:
            worker.kill()
        for worker in workers:
            worker.join()


@contextlib.contextmanager
def warm_ups(at_once: int) -> Iterator[list[int]]:
    """Fresh processes each running a child's warm-up, ``at_once`` at a time; yields the count started."""
    stop = threading.Event()
    started = [0]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]),
    }

    def loop() -> None:
        while not stop.is_set():
            started[0] += 1
            subprocess.run([sys.executable, "-c", WARM_UP], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(at_once)]
    for thread in threads:
        thread.start()
    time.sleep(3.0)  # the first ones past their imports, at their device work
    try:
        yield started
    finally:
        stop.set()
        for thread in threads:
            thread.join()


HOG = """
import sys, time, torch
free_bytes = int(float(sys.argv[1]) * 2**30)
held = []
while torch.cuda.mem_get_info()[0] > free_bytes + 2**28:
    held.append(torch.empty(min(2**30, torch.cuda.mem_get_info()[0] - free_bytes), dtype=torch.uint8, device="cuda"))
print(torch.cuda.mem_get_info()[0], flush=True)
time.sleep(3600)
"""


@contextlib.contextmanager
def memory_held(free_gib: float) -> Iterator[None]:
    """Another process holding the device's memory down to ``free_gib``; this process's cache emptied."""
    torch.cuda.empty_cache()
    hog = subprocess.Popen([sys.executable, "-c", HOG, str(free_gib)], stdout=subprocess.PIPE, text=True)
    try:
        assert hog.stdout is not None
        print(f"memory: {int(hog.stdout.readline() or 0) / 2**30:.1f} GiB left free", flush=True)
        yield
    finally:
        hog.kill()
        hog.wait()


@contextlib.contextmanager
def load(condition: str, cores: int, free_gib: float) -> Iterator[list[int]]:
    """The condition's load on the host and the GPU; yields how many warm-ups it has started."""
    with contextlib.ExitStack() as stack:
        if condition in ("cpu", "both"):
            stack.enter_context(cpu_load(2 * cores))
        if condition == "memory":
            stack.enter_context(memory_held(free_gib))
        started = stack.enter_context(warm_ups(4)) if condition in ("warm_ups", "both") else [0]
        yield started


def relu_kernel() -> tuple[str, Callable[[], Any], Callable[[int], None]]:
    """A kernel of a few µs: the host's launches are most of its timing's risk."""
    x = torch.randn(4096, device="cuda")
    sets = [torch.randn(4096, device="cuda") for _ in range(3)]

    def prepare(call: int) -> None:
        x.copy_(sets[call % len(sets)])

    return "relu_4096", lambda: torch.relu(x), prepare


def problem_kernel(path: Path) -> tuple[str, Callable[[], Any], Callable[[int], None]]:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    model = module.Model(*module.get_init_inputs()).cuda().eval()
    sets = []
    for seed in range(3):
        torch.manual_seed(seed)
        sets.append([t.cuda() if isinstance(t, torch.Tensor) else t for t in module.get_inputs()])
    inputs = [t.clone() if isinstance(t, torch.Tensor) else t for t in sets[0]]

    def prepare(call: int) -> None:
        for target, value in zip(inputs, sets[call % len(sets)]):
            if isinstance(target, torch.Tensor):
                target.copy_(value)

    return path.stem, lambda: model(*inputs), prepare


def sample(fn: Callable[[], Any], prepare: Callable[[int], None], seconds: float) -> dict[str, Any]:
    retries_before = torch.cuda.memory_stats().get("num_alloc_retries", 0)
    with torch.no_grad():
        run = TimedRun(fn, prepare=prepare)
        min_samples, batch = run.sized(MIN_SAMPLES, BATCH)
        ends_s = []  # wall seconds since sampling started, at each batch's end
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            run.batch(batch)
            ends_s.append(time.perf_counter() - started)
    return {
        "samples": run.samples,
        "positions": run.positions,
        "batch": batch,
        "min_samples": min_samples,
        "ends_s": ends_s,
        # the caching allocator's frees-and-retries of a cudaMalloc that failed: memory too short for its cache
        "alloc_retries": torch.cuda.memory_stats().get("num_alloc_retries", 0) - retries_before,
    }


def replay(rule: Callable[[list[float]], float], run: dict[str, Any]) -> dict[str, Any]:
    """Where ``time_gpu`` would have stopped with this rule, over the same samples, batch by batch."""
    batch, samples = run["batch"], run["samples"]
    for i, end_s in enumerate(run["ends_s"]):
        taken = samples[: (i + 1) * batch]
        if stops(len(taken), rule(taken), end_s, run["min_samples"]):
            return {
                "samples": len(taken),
                "seconds": round(end_s, 3),
                "median_ms": statistics.median(taken),
                "stopped_by": "budget" if end_s > BUDGET_S else "samples" if len(taken) >= MAX_SAMPLES else "rse",
            }
    return {
        "samples": len(samples),
        "seconds": round(run["ends_s"][-1], 3),
        "median_ms": statistics.median(samples),
        "stopped_by": "not within the run",
    }


def summary(run: dict[str, Any], quiet_median: float | None) -> dict[str, Any]:
    samples, positions = run["samples"], run["positions"]
    firsts = [s for s, p in zip(samples, positions) if p == 0]
    others = [s for s, p in zip(samples, positions) if p > 0]
    median = statistics.median(samples)
    reference = quiet_median or median
    slow = [s > 1.05 * reference for s in samples]
    row: dict[str, Any] = {
        "samples": len(samples),
        "batch": run["batch"],
        "median_ms": median,
        "std_ms": statistics.pstdev(samples),
        "mean_rse": mean_rse(samples),
        "median_rse": median_rse(samples),
        "first_of_batch_median_ms": statistics.median(firsts) if firsts else None,
        "others_median_ms": statistics.median(others) if others else None,
        "slow_share_first": sum(s for s, p in zip(slow, positions) if p == 0) / max(1, len(firsts)),
        "slow_share_others": sum(s for s, p in zip(slow, positions) if p > 0) / max(1, len(others)),
        "alloc_retries": run.get("alloc_retries", 0),  # runs recorded before 2026-12-05 have none
        "stop_mean_rule": replay(mean_rse, run),
        "stop_median_rule": replay(median_rse, run),
    }
    for rule in ("stop_mean_rule", "stop_median_rule"):
        row[rule]["off_quiet"] = row[rule]["median_ms"] / reference - 1
    return row


def plot(runs: dict[str, dict[str, dict[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 3.2 * len(runs)), squeeze=False)
    for ax, (kernel, by_condition) in zip(axes[:, 0], runs.items()):
        for condition, run in by_condition.items():
            ax.plot(run["samples"], ".", markersize=2, label=condition)
        ax.set_title(kernel)
        ax.set_xlabel("sample")
        ax.set_ylabel("ms")
        ax.set_yscale("log")
        ax.legend(markerscale=5)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problem", type=Path, action="append", default=[], help="a KernelBench problem file (repeatable)")
    parser.add_argument("--seconds", type=float, default=12.0, help="sampling per kernel and condition")
    parser.add_argument("--conditions", nargs="+", default=list(HOST_CONDITIONS), choices=CONDITIONS)
    parser.add_argument("--no-relu", action="store_true", help="only the --problem kernels")
    parser.add_argument("--free-gib", type=float, default=12.0, help="device memory the memory condition leaves free")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    kernels = [*([] if args.no_relu else [relu_kernel()]), *(problem_kernel(p) for p in args.problem)]
    cores = os.cpu_count() or 1
    runs: dict[str, dict[str, dict[str, Any]]] = {name: {} for name, _, _ in kernels}
    started_warm_ups: dict[str, int] = {}
    for condition in args.conditions:
        with load(condition, cores, args.free_gib) as warm_ups_started:
            for name, fn, prepare in kernels:
                print(f"{condition}: {name}", flush=True)
                runs[name][condition] = sample(fn, prepare, args.seconds)
            started_warm_ups[condition] = warm_ups_started[0]
    report: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "cpus": cores},
        "settings": {
            "target_rse": TARGET_RSE,
            "budget_s": BUDGET_S,
            "min_timed_s": MIN_TIMED_S,
            "batch_s": BATCH_S,
            "seconds": args.seconds,
            "free_gib": args.free_gib,
        },
        "warm_ups_started": started_warm_ups,
        "kernels": {},
    }
    table = Table(title="timing spread and stop rules (target rse 0.5 %, budget 10 s)")
    for column in (
        "kernel",
        "condition",
        "median ms",
        "std ms",
        "first/others",
        "slow first/others",
        "mean rule n, s, off",
        "median rule n, s, off",
        "alloc retries",
    ):
        table.add_column(column)
    for name, by_condition in runs.items():
        quiet = statistics.median(by_condition["quiet"]["samples"]) if "quiet" in by_condition else None
        report["kernels"][name] = {}
        for condition, run in by_condition.items():
            row = summary(run, quiet)
            report["kernels"][name][condition] = row
            mean_stop, median_stop = row["stop_mean_rule"], row["stop_median_rule"]
            table.add_row(
                name[:28],
                condition,
                f"{row['median_ms']:.4g}",
                f"{row['std_ms']:.3g}",
                f"{row['first_of_batch_median_ms']:.4g}/{row['others_median_ms'] or 0:.4g}",
                f"{row['slow_share_first']:.0%}/{row['slow_share_others']:.0%}",
                f"{mean_stop['samples']}, {mean_stop['seconds']:.2f}, {mean_stop['off_quiet']:+.1%}",
                f"{median_stop['samples']}, {median_stop['seconds']:.2f}, {median_stop['off_quiet']:+.1%}",
                str(row["alloc_retries"]),
            )
    Console(width=200).print(table)
    (args.out / "timing_noise.json").write_text(json.dumps(report, indent=1))
    with open(args.out / "timing_noise_samples.json", "w") as f:
        json.dump(runs, f)
    plot(runs, args.out / "timing_noise.png")


if __name__ == "__main__":
    main()

"""Candidates per minute: our reward evaluator against KernelBench's own evaluation script.

Both evaluate the same (problem, candidate) pairs on the same GPU, one after the other:

- ``kernelbench``: what ``scripts/eval_from_generations.py`` does on one GPU with its defaults
  (spawn start method, a fresh ``multiprocessing.Pool(1)`` per sample, ``eval_kernel_against_ref``
  with 5 correctness trials, 100 timing trials with CUDA events, 180 s timeout). KernelBench is
  not vendored: pass a checkout with ``--kernelbench``. Its ``utils`` imports the LLM clients
  ``openai`` and ``litellm`` at module level; where they are not installed (the GPU machine is
  offline) empty stand-ins are registered, since evaluation never calls them.
  Resumable from its rows file, so a long set can be timed over several device calls.
- ``ours``: one ``Evaluator`` as a GPU reward worker holds it (sandboxed reference and candidate
  children, default settings, warm pool), one group per problem, ``--concurrency`` groups in flight
  as the worker's threads pool runs them (timing stays exclusive per GPU); the clock starts once
  the worker's pool is warm, as for a worker that was already running when the jobs arrived.

``--group G`` scores G candidates per problem, as an RL pipeline's group (CA-GRPO) or a pass@k
evaluation does: G launch-configuration variants of the template's kernel (num_warps, block and tile
caps; each a different source, compiled on its own). Ours evaluates each problem's group in one
``evaluate_group`` call (one reference run serves the group); KernelBench's script evaluates every
(problem, sample) pair on its own, as ``eval_from_generations`` does for several samples.

While ours runs, a sampler records the machine's CPU and GPU utilisation and memory (``utilisation``).

Steps:
  prepare  write the template generator's candidates for a problem directory (CPU is fine)
  run      time both evaluators and write ``kernelbench_throughput.json`` to ``--out``

    python benchmarks/kernelbench_throughput.py prepare --problems KB/level1 --candidates .bench/cands
    python benchmarks/kernelbench_throughput.py run --problems KB/level1 --candidates .bench/cands \
        --kernelbench /path/to/KernelBench --out benchmarks/results [--group 4]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import platform
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import track
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from device_lock_trace import DeviceLockTrace  # noqa: E402  (this folder is on the path when the script runs)

if TYPE_CHECKING:
    from reward_svc.evaluate import GroupSeeds

console = Console()
KB_TIMEOUT_S = 180


def prepare(problems: Path, candidates: Path, limit: int) -> None:
    from coder_svc.template import TemplateGenerator
    from services.llm.chat import Sampling

    generator = TemplateGenerator()
    candidates.mkdir(parents=True, exist_ok=True)
    written = 0
    for problem in track(sorted(problems.glob("*.py")), description="template candidates", console=console):
        if written >= limit:
            break
        draft = generator.generate(problem.read_text(), "triton", Sampling(n=1))[0]
        if draft.source:
            (candidates / problem.name).write_text(draft.source)
            written += 1
    console.print(f"{written} candidates in {candidates}")


# Launch-configuration knobs the template writes, and the values variant i takes (variant 0: as written).
_KNOBS = [  # the tile first: the block cap's values must not be read as a tile
    (re.compile(r"\b2048\b"), ["2048", "4096", "1024", "512"]),
    (re.compile(r"num_warps=4\b"), ["num_warps=4", "num_warps=8", "num_warps=2", "num_warps=16"]),
    (re.compile(r"warps = 8 if"), ["warps = 8 if", "warps = 4 if", "warps = 16 if", "warps = 2 if"]),
    (re.compile(r"min\(1024, max\(16,"), ["min(1024, max(16,", "min(2048, max(16,", "min(512, max(16,", "min(256, max(16,"]),
]


def tuning_variants(source: str, group: int) -> list[str]:
    """Up to ``group`` distinct sources: the template's kernel under other launch configurations. Variant
    i's digits in base 4 pick the values of the knobs the source has, one digit a knob (the first knob
    changes fastest), so two knobs give 16 distinct variants and a group of 8 is 8 candidates."""
    knobs = [(pattern, values) for pattern, values in _KNOBS if pattern.search(source)]
    variants = []
    for i in range(group):
        variant, digits = source, i
        for pattern, values in knobs:
            variant = pattern.sub(values[digits % len(values)], variant)
            digits //= len(values)
        if variant not in variants:
            variants.append(variant)
    return variants


Work = tuple[str, str, list[str]]  # problem file name, reference source, the group's candidate sources


def problem_groups(problems: Path, candidates: Path, group: int) -> list[Work]:
    return [
        (c.name, (problems / c.name).read_text(), tuning_variants(c.read_text(), group))
        for c in sorted(candidates.glob("*.py"))
        if (problems / c.name).exists()
    ]


def _sample_name(problem: str, variant: int, group: int) -> str:
    return problem if group == 1 else f"{problem}#{variant}"


class UtilisationSampler:
    """Once a second, in a thread: CPU busy share, host memory in use, the scratch tmpfs's fill and,
    where NVML is there, the GPU's busy share and memory. Summarised as mean and peak."""

    def __init__(self, scratch: Path | None) -> None:
        self.scratch, self.samples = scratch, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> UtilisationSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        import psutil

        try:
            import pynvml

            pynvml.nvmlInit()
            gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:  # no NVML: CPU figures only
            pynvml = gpu = None
        psutil.cpu_percent()
        started = time.perf_counter()
        while not self._stop.wait(1.0):
            sample = {
                "t": round(time.perf_counter() - started, 1),
                "cpu_pct": psutil.cpu_percent(),
                "host_mem_gb": psutil.virtual_memory().used / 1e9,
            }
            if self.scratch is not None and self.scratch.exists():
                sample["scratch_gb"] = psutil.disk_usage(str(self.scratch)).used / 1e9
            if gpu is not None:
                sample["gpu_pct"] = pynvml.nvmlDeviceGetUtilizationRates(gpu).gpu
                sample["gpu_mem_gb"] = pynvml.nvmlDeviceGetMemoryInfo(gpu).used / 1e9
            self.samples.append(sample)

    def summary(self) -> dict[str, Any]:
        keys = sorted({k for s in self.samples for k in s} - {"t"})
        return {
            k: {
                "mean": round(statistics.fmean(s[k] for s in self.samples if k in s), 1),
                "max": round(max(s[k] for s in self.samples if k in s), 1),
            }
            for k in keys
        } | {"seconds": len(self.samples)}


# ----------------------------------------------------------------------------- KernelBench


def _kb_eval_one(kernelbench: str, reference: str, candidate: str, build_dir: str) -> dict[str, Any]:
    """In a fresh spawned process, as eval_from_generations.evaluate_single_sample does."""
    import torch

    sys.path.insert(0, str(Path(kernelbench) / "src"))
    for name in ("openai", "litellm"):
        try:
            __import__(name)
        except ImportError:
            stand_in = types.ModuleType(name)
            stand_in.OpenAI = stand_in.completion = None  # type: ignore[attr-defined]
            sys.modules[name] = stand_in
    from kernelbench.eval import eval_kernel_against_ref

    try:
        result = eval_kernel_against_ref(
            original_model_src=reference,
            custom_model_src=candidate,
            measure_performance=True,
            timing_method="cuda_event",
            num_correct_trials=5,
            num_perf_trials=100,
            build_dir=build_dir,
            device=torch.device("cuda:0"),
            backend="triton",
            precision=torch.float32,
        )
    except Exception as exc:  # their wrapper's last-level catch
        return {"compiled": False, "correct": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    if result is None:
        return {"compiled": False, "correct": False, "error": "no result"}
    return {
        "compiled": bool(result.compiled),
        "correct": bool(result.correctness),
        "runtime_us": result.runtime,
        "ref_runtime_us": getattr(result, "ref_runtime", None),
    }


def _checkpoint(rows: list[dict[str, Any]], partial: Path) -> None:
    """Rows so far, so a run cut short by a time limit still leaves its figures."""
    partial.write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def run_kernelbench(work: list[Work], kernelbench: Path, partial: Path, group: int, variant: int | None = None) -> dict[str, Any]:
    """One sample after the other, as their script does on one GPU; resumes from ``partial``, so a
    set longer than one device call is timed over several (the rate is over the rows' wall times).
    ``variant``: only that sample of each group (their rate per sample, without timing every one)."""
    context = mp.get_context("spawn")
    samples = [
        (_sample_name(name, i, group), reference, candidate)
        for name, reference, candidates in work
        for i, candidate in enumerate(candidates)
        if variant in (None, i)
    ]
    names = {s[0] for s in samples}
    rows = [r for r in _load_rows(partial) if r["problem"] in names]
    done = {r["problem"] for r in rows}
    with tempfile.TemporaryDirectory() as build_root:
        for name, reference, candidate in track(
            [s for s in samples if s[0] not in done], description="KernelBench eval", console=console
        ):
            t0 = time.perf_counter()
            with context.Pool(1) as pool:
                try:
                    row = pool.apply_async(_kb_eval_one, (str(kernelbench), reference, candidate, f"{build_root}/{name}")).get(
                        timeout=KB_TIMEOUT_S
                    )
                except mp.TimeoutError:
                    row = {"compiled": False, "correct": False, "error": "timeout"}
            rows.append({"problem": name, "wall_s": round(time.perf_counter() - t0, 3), **row})
            _checkpoint(rows, partial)
    return _summary(rows, sum(r["wall_s"] for r in rows))


def _load_rows(partial: Path) -> list[dict[str, Any]]:
    if not partial.exists():
        return []
    return [json.loads(line) for line in partial.read_text().splitlines() if line.strip()]


# ----------------------------------------------------------------------------- ours


def replayable_seeds(run_seed: int) -> Callable[[str], GroupSeeds]:
    """Each group's seeds from ``run_seed`` and its reference, the same in every run given it (inputs, weights and
    the knockout case): two runs of the same candidates judge the same values in the same trials, so their
    verdicts compare one for one (``verdict_equality.py``; with secret seeds a borderline problem's candidates
    fall either side of the tolerance from run to run)."""

    def seeds(reference: str) -> GroupSeeds:
        digest = hashlib.sha256(f"{run_seed}\0{reference}".encode()).digest()
        first, second, third, knockout = (int.from_bytes(digest[i : i + 4], "big") % (2**31 - 1) for i in (0, 4, 8, 12))
        return {"input": first, "weights": [second, (second + 1 + third % (2**30)) % (2**31 - 1)], "knockout": knockout}

    return seeds


def unfinished(work: list[Work], rows: list[dict[str, Any]]) -> tuple[list[Work], set[str]]:
    """The groups of ``work`` that ``rows`` (a run's, written a whole group at a time) holds none of, and the
    problems it holds."""
    finished = {row["problem"].split("#")[0] for row in rows}
    return [w for w in work if w[0] not in finished], finished


def run_ours(
    work: list[Work], partial: Path, concurrency: int, group: int, seed: int | None = None, resume: bool = False
) -> dict[str, Any]:
    """``concurrency`` groups in flight, as a GPU reward worker's threads pool runs its jobs; ``seed``: replayable
    seeds (``replayable_seeds``) instead of secret ones. ``resume``: the groups ``partial`` holds are not run
    again (a set of verdicts longer than one device call, gathered over several with one seed); the report's
    figures are this run's groups only, and ``partial`` keeps them all."""
    from reward_svc.evaluate import Evaluator, child_slots, warm_children
    from services.config import get_settings
    from services.schemas.reward import ScoreOptions

    # a GPU worker with this many threads: its slots are reward_parallel_children for each (evaluate.child_slots)
    settings = get_settings().model_copy(update={"reward_gpu_concurrency": concurrency, "gpu_devices": [0]})
    evaluator = Evaluator(settings, seeds=replayable_seeds(seed) if seed is not None else None)
    options = ScoreOptions(backend="triton", device="cuda")
    pool = evaluator.pool("cuda")
    warmed = pool.wait_ready(timeout_s=300)
    earlier = _load_rows(partial) if resume else []
    work, finished = unfinished(work, earlier)
    rows: list[dict[str, Any]] = []

    def evaluate_group(name: str, reference: str, candidates: list[str]) -> list[dict[str, Any]]:
        t0 = time.perf_counter()
        verdicts = evaluator.evaluate_group(reference, candidates, options).verdicts
        wall = round(time.perf_counter() - t0, 3)
        return [
            {
                "problem": _sample_name(name, i, group),
                "group_wall_s": wall,
                "wall_s": round(wall / len(verdicts), 3),
                "status": v.status,
                "correct": v.correct,
                "guard": v.guard,
                "speedup": v.speedup,
                "reason": v.reason[:200],
                "seconds": v.details.get("seconds"),
                "phases": v.details.get("phases"),
                "device_memory": v.details.get("device_memory"),
                "outputs_on_device": v.details.get("outputs_on_device"),
                "device_exchange_fallback": v.details.get("device_exchange_fallback"),
                "timing": _timing_stats(v.details.get("timing")),
                "ref_timing": _timing_stats(v.details.get("ref_timing")),
            }
            for i, v in enumerate(verdicts)
        ]

    started = time.perf_counter()
    executor = ThreadPoolExecutor(max_workers=concurrency)
    cut = False
    try:
        with UtilisationSampler(evaluator.layout.exchange) as sampler, DeviceLockTrace(evaluator.layout.gpu_lock("cuda")) as lock:
            futures = [executor.submit(evaluate_group, *w) for w in work]
            try:
                for future in track(as_completed(futures), total=len(futures), description="KernelZero eval", console=console):
                    rows.extend({**row, "finished_s": round(time.perf_counter() - started, 3)} for row in future.result())
                    _checkpoint(earlier + rows, partial)
            except KeyboardInterrupt:  # the step's time limit (gpu_run.sh): the groups done so far are the figure
                cut = True
    finally:
        # never wait for groups still running: after the loop none are, and after a cut or an error (a progress bar
        # that cannot render) their rows would be lost anyway, while the device call's time runs out
        executor.shutdown(wait=False, cancel_futures=True)
        evaluator.close()
    summary = _summary(rows, time.perf_counter() - started)
    summary["samples"] = sampler.samples
    summary.update(
        concurrency=concurrency,
        group=group,
        warm_children=warm_children(evaluator.settings, "cuda"),
        # the scheduling settings the run had (an A/B sets them through the environment)
        settings=evaluator.settings.model_dump(
            include={"reward_parallel_children", "reward_outputs_in_flight", "reward_gpu_concurrency"}
        ),
        pool_warm_at_start=warmed,
        slot_seconds=slot_seconds(rows, child_slots(evaluator.settings, concurrency), time.perf_counter() - started),
        resumed_groups=len(finished),
        utilisation=sampler.summary(),
        device_lock=lock.summary(),
        cut=cut,
        exchange={
            "budget_bytes": evaluator.exchange_max_bytes,
            "scratch_total_bytes": shutil.disk_usage(evaluator.layout.exchange).total,
        },
    )
    return summary


def _summary(rows: list[dict[str, Any]], total_s: float) -> dict[str, Any]:
    walls = [r["wall_s"] for r in rows]
    groups = {r["problem"].split("#")[0]: r for r in rows if "group_wall_s" in r}  # one row per group
    first_group_s = min((r["finished_s"] for r in groups.values() if "finished_s" in r), default=None)
    later = [r for r in rows if first_group_s is not None and r.get("finished_s", 0) > first_group_s]
    return {
        "candidates": len(rows),
        "total_s": round(total_s, 2),
        "candidates_per_min": round(60 * len(rows) / total_s, 2) if total_s else None,
        "p50_s": round(statistics.median(walls), 3) if walls else None,
        "group_p50_s": _median(r["group_wall_s"] for r in groups.values()),
        "first_group_s": first_group_s,
        # the rate once the burst's first group is out: candidates of the groups done since, per minute to the end
        "candidates_per_min_after_first_group": round(60 * len(later) / (total_s - first_group_s), 2)
        if first_group_s is not None and later and total_s > first_group_s
        else None,
        "median_waits_s": {
            "candidate_lock": _median(_phase(r, "candidate", "lock_wait") for r in rows),
            "reference_lock": _median(_phase(r, "reference", "lock_wait") for r in groups.values()),
            "candidate_slot": _median(_waiting(r, "slot") for r in rows),
            "candidate_child": _median(_waiting(r, "child") for r in rows),
            "reference_slot": _median(_waiting(r, "reference_slot") for r in groups.values()),
            "reference_device_memory": _median(_waiting(r, "reference_device_memory") for r in groups.values()),
            "reference_child": _median(_waiting(r, "reference_child") for r in groups.values()),
        },
        # runs that ran out of device memory (or, for a reference, found no room in the scratch dir) and the waits after them
        "retried": {
            "candidates": sum(bool(_waiting(r, "retries")) for r in rows),
            "candidate_s": round(sum(_waiting(r, "retries") or 0.0 for r in rows), 1),
            "references": sum(bool(_waiting(r, "reference_retries")) for r in groups.values()),
            "reference_s": round(sum(_waiting(r, "reference_retries") or 0.0 for r in groups.values()), 1),
        },
        "device_memory": _device_memory(rows),
        "median_phases_s": {
            side: _median_phases((r.get("phases") or {}).get(side) for r in sides)
            for side, sides in (("candidate", rows), ("candidate_trials", rows), ("reference", list(groups.values())))
        },
        "correct": sum(bool(r.get("correct")) for r in rows),
        # with the device exchange on: outputs judged without a file, and the candidates whose child fell back to files
        "outputs_on_device": sum(r.get("outputs_on_device") or 0 for r in rows),
        "device_exchange_fallbacks": sorted({r["device_exchange_fallback"] for r in rows if r.get("device_exchange_fallback")}),
        "longest_timings": longest_timings(rows),
        "rows": rows,
    }


TIMING_STATS = ("median_ms", "std_ms", "samples", "rse", "calls")


def _timing_stats(timing: dict[str, Any] | None) -> dict[str, Any] | None:
    return {k: timing[k] for k in TIMING_STATS if k in timing} if timing else None


def longest_timings(rows: list[dict[str, Any]], n: int = 8) -> list[dict[str, Any]]:
    """The evaluations whose exclusive timing held the device longest (the lock's timing share is their
    sum; a few seconds' tail stops everyone), each with what its timing measured: how many samples it
    took and how scattered they were (``rse`` against the target that ends a timing)."""
    groups = {r["problem"].split("#")[0]: r for r in rows}
    held = [(_phase(r, "candidate", "timing"), r["problem"], "candidate", r.get("timing")) for r in rows]
    held += [(_phase(r, "reference", "timing"), name, "reference", r.get("ref_timing")) for name, r in groups.items()]
    held = sorted((h for h in held if h[0]), key=lambda h: -h[0])
    return [{"problem": name, "side": side, "timing_s": seconds, **(stats or {})} for seconds, name, side, stats in held[:n]]


def _device_memory(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What candidates reserved of device memory against the peak their children reported (the
    allocator's, without the context the reservation also covers), and the waits for it;
    ``over_reservation``: the candidates whose peak passed their whole reservation."""
    from reward_svc.admission import DEVICE_CONTEXT_BYTES

    sized = [r["device_memory"] for r in rows if (r.get("device_memory") or {}).get("peak")]
    waits = [w for w in (_waiting(r, "device_memory") for r in rows) if w is not None]
    return {
        "wait_s": {"median": _median(waits), "total": round(sum(waits), 1)},
        "reserved_gb_median": _median(m["reserved"] / 1e9 for m in sized),
        "peak_gb_median": _median(m["peak"] / 1e9 for m in sized),
        "peak_over_reserved_max": round(max((m["peak"] / m["reserved"] for m in sized), default=0), 3),
        "peak_over_reserved_less_context_max": round(
            max((m["peak"] / (m["reserved"] - DEVICE_CONTEXT_BYTES) for m in sized), default=0), 3
        ),
        "over_reservation": sum(m["peak"] > m["reserved"] for m in sized),
    }


def _median_phases(phases: Any) -> dict[str, float | None]:
    """Each phase's median over the children that reported phases (a phase a child did not go
    through counts as 0 s: a compile released only where a kernel was built)."""
    reported = [p for p in phases if p]
    names = sorted({name for p in reported for name in p})
    return {name: _median(p.get(name, 0.0) for p in reported) for name in names}


def _phase(row: dict[str, Any], side: str, name: str) -> float | None:
    return ((row.get("phases") or {}).get(side) or {}).get(name)


def slot_seconds(rows: list[dict[str, Any]], slots: int, total_s: float) -> dict[str, Any]:
    """Where the worker's slot-seconds (its slots times the run) went: candidates' last runs and judging,
    their waits inside the slot (for scratch room, device memory, a warm child), references' runs and
    waits in theirs; ``other_share``, the rest: runs that were run again, the work of groups a cut
    dropped, and slots free for want of a candidate or reference able to take them."""
    groups = {r["problem"].split("#")[0]: r for r in rows if "group_wall_s" in r}

    def total(values: Any) -> float:
        return round(sum(v or 0.0 for v in values), 1)

    candidates = total((r.get("seconds") or {}).get("candidate", 0.0) + (r.get("seconds") or {}).get("judge", 0.0) for r in rows)
    waiting = {name: total(_waiting(r, name) for r in rows) for name in ("admission", "device_memory", "child")}
    references = total(
        ((r.get("seconds") or {}).get("reference") or 0.0)
        + sum(_waiting(r, name) or 0.0 for name in ("reference_device_memory", "reference_child"))
        for r in groups.values()
    )
    capacity = slots * total_s
    used = candidates + sum(waiting.values()) + references
    return {
        "slots": slots,
        "capacity": round(capacity, 1),
        "candidates": candidates,
        "candidates_waiting_in_slot": waiting,
        "references": references,
        "other_share": round(1 - used / capacity, 3) if capacity else None,
    }


def _waiting(row: dict[str, Any], name: str) -> float | None:
    return ((row.get("seconds") or {}).get("waiting") or {}).get(name)


def _median(values: Any) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 3) if present else None


def plot_progress(summary: dict[str, Any], path: Path, title: str) -> None:
    """Candidates finished over time, with the CPU's and the GPU's busy share beside them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, done_axis = plt.subplots(figsize=(9, 4.5))
    finished = sorted(r["finished_s"] for r in summary["rows"] if "finished_s" in r)
    done_axis.step(finished, range(1, len(finished) + 1), where="post", color="black", label="candidates finished")
    done_axis.set_xlabel("seconds since the pool was warm")
    done_axis.set_ylabel("candidates finished")
    busy_axis = done_axis.twinx()
    samples = summary.get("samples") or []
    for key, colour in (("cpu_pct", "tab:blue"), ("gpu_pct", "tab:green")):
        points = [(s["t"], s[key]) for s in samples if key in s]
        if points:
            busy_axis.plot(*zip(*points), color=colour, alpha=0.5, linewidth=0.8, label=key.replace("_pct", " busy %"))
    busy_axis.set_ylim(0, 105)
    busy_axis.set_ylabel("busy %")
    handles = done_axis.get_legend_handles_labels()[0] + busy_axis.get_legend_handles_labels()[0]
    done_axis.legend(handles, [h.get_label() for h in handles], loc="upper left")
    done_axis.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=["prepare", "run"])
    parser.add_argument("--problems", type=Path, required=True)
    parser.add_argument("--candidates", type=Path, required=True)
    parser.add_argument("--kernelbench", type=Path, help="a KernelBench checkout (run step)")
    parser.add_argument("--limit", type=int, default=30)
    parser.add_argument("--only", choices=["ours", "kernelbench"], help="time one side only")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--concurrency", type=int, help="our groups in flight (default: KZ_REWARD_GPU_CONCURRENCY)")
    parser.add_argument("--group", type=int, default=1, help="candidates per problem: launch-configuration variants (run step)")
    parser.add_argument("--variant", type=int, help="KernelBench's side: only this variant of each group")
    parser.add_argument("--seed", type=int, help="our side: replayable seeds, for comparing two runs' verdicts")
    parser.add_argument("--resume", action="store_true", help="our side: skip the groups the rows file already holds")
    args = parser.parse_args()
    if args.step == "prepare":
        prepare(args.problems, args.candidates, args.limit)
        return
    work = problem_groups(args.problems, args.candidates, args.group)[: args.limit]
    import torch

    report: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "gpu": torch.cuda.get_device_name(0),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "cpus": mp.cpu_count(),
        },
        "problems": len(work),
        "group": args.group,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    if args.only != "kernelbench":
        from services.config import get_settings

        report["ours"] = run_ours(
            work,
            args.out / "ours_rows.jsonl",
            args.concurrency or get_settings().reward_gpu_concurrency,
            args.group,
            args.seed,
            args.resume,
        )
    if args.only != "ours":
        report["kernelbench"] = run_kernelbench(
            work, args.kernelbench, args.out / "kernelbench_rows.jsonl", args.group, args.variant
        )
    if "ours" in report and "kernelbench" in report:
        report["throughput_ratio"] = round(report["ours"]["candidates_per_min"] / report["kernelbench"]["candidates_per_min"], 2)
        theirs = {r["problem"]: r["correct"] for r in report["kernelbench"]["rows"]}
        report["agreement"] = sum(
            r["correct"] == theirs.get(r["problem"]) for r in report["ours"]["rows"] if r["problem"] in theirs
        )
    (args.out / f"kernelbench_throughput{'_' + args.only if args.only else ''}.json").write_text(json.dumps(report, indent=1))
    title = f"{len(work)} KernelBench problems, template Triton candidates, groups of {args.group}"
    if "ours" in report:
        plot_progress(report["ours"], args.out / f"throughput_g{args.group}.png", f"ours: {title}")
    table = Table(title=title)
    for column in ("evaluator", "candidates/min", "after first group /min", "p50 s", "group p50 s", "first group s", "correct"):
        table.add_column(column)
    for side in ("ours", "kernelbench"):
        if side in report:
            s = report[side]
            table.add_row(
                side,
                str(s["candidates_per_min"]),
                str(s.get("candidates_per_min_after_first_group", "")),
                str(s["p50_s"]),
                str(s.get("group_p50_s", "")),
                str(s.get("first_group_s", "")),
                f"{s['correct']}/{s['candidates']}",
            )
    console.print(table)
    if "ours" in report:
        console.print(f"ours, median waits (s): {report['ours']['median_waits_s']}")
        console.print(f"ours, retried runs: {report['ours']['retried']}")
        console.print(f"ours, device memory: {report['ours']['device_memory']}")
        console.print(f"ours, median phases (s): {report['ours']['median_phases_s']}")
        lock = {k: v for k, v in report["ours"].get("device_lock", {}).items() if k != "long_drain_stacks"}
        console.print(f"ours, device lock: {lock}")
    if "throughput_ratio" in report:
        console.print(f"throughput ratio {report['throughput_ratio']}x; verdicts agree on {report['agreement']} samples")
    if report.get("ours", {}).get("cut"):
        console.print("cut by the time limit: the rate is over the groups done; those in flight were dropped")
        sys.stdout.flush()
        os._exit(0)  # not waiting for the groups still in flight


if __name__ == "__main__":
    main()

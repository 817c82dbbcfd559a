"""The evaluation loop: problems × samples, each problem's samples scored as one group in the
local sandboxed evaluator, one JSON line per sample appended as soon as its problem is done.

With ``concurrency`` above 1, several problems are scored at once (on a GPU the evaluator overlaps
their compiles and correctness trials and keeps timing exclusive); generation runs concurrently
only for a generator that says it is thread-safe (not a local model held in this process).

Resumable: a rerun with the same ``--out`` reads ``samples.jsonl`` first and generates and
scores only the samples that are not there. The harness times itself: per sample, the wall time
of its problem minus generation and evaluation, shared equally by the problem's new samples.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from coder_svc.best_of_n import LocalScorer, score_drafts
from coder_svc.drafts import KernelBackend, KernelGenerator
from services.llm.chat import Sampling
from services.queue.unfit import ProcessUnfit
from services.schemas.coder import CandidateReport
from services.schemas.reward import ScoreOptions

SAMPLES_FILE = "samples.jsonl"
ERROR = "error"  # the harness could not get a verdict (generator or scorer raised); counts as failed until rerun
LEVEL_DIR = re.compile(r"^level(\d+)$")


@dataclass(frozen=True)
class Problem:
    id: str  # unique in the run: "level1/19_ReLU" or "19_ReLU" for a flat directory
    level: int | None
    path: Path


def _order(path: Path) -> tuple[int, str]:
    """KernelBench numbers its problems ("19_ReLU.py"): numeric order, then by name."""
    number = re.match(r"^(\d+)", path.stem)
    return (int(number.group(1)) if number else 1 << 30, path.stem)


def discover(root: Path, levels: Iterable[int] | None = None, limit: int | None = None) -> list[Problem]:
    """A KernelBench tree (``level1/``, ``level2/``, ...) or a flat directory of problem files.
    ``limit`` keeps the first N problems of each level."""
    level_dirs = sorted((int(m.group(1)), d) for d in root.iterdir() if d.is_dir() and (m := LEVEL_DIR.match(d.name)))
    wanted = set(levels) if levels else None
    groups: list[tuple[int | None, Path]] = (
        [(n, d) for n, d in level_dirs if wanted is None or n in wanted] if level_dirs else [(None, root)]
    )
    problems = []
    for level, directory in groups:
        files = sorted((p for p in directory.glob("*.py") if not p.name.startswith("_")), key=_order)[:limit]
        problems += [Problem(f"{directory.name}/{p.stem}" if level is not None else p.stem, level, p) for p in files]
    return problems


def load_records(out: Path) -> list[dict[str, Any]]:
    """Every sample's latest record (a sample that errored and was retried appears twice in the file)."""
    path = out / SAMPLES_FILE
    if not path.exists():
        return []
    latest = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        latest[(record["problem"], record["sample"])] = record
    return list(latest.values())


def drop_partial_line(path: Path) -> None:
    """A run killed mid-write leaves a line without its newline: cut it, so its samples are redone
    and the next append starts on a fresh line."""
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        path.write_bytes(data[: data.rfind(b"\n") + 1])


@dataclass
class Harness:
    generator: KernelGenerator
    scorer: LocalScorer
    backend: KernelBackend
    samples: int
    options: ScoreOptions
    sampling: Sampling
    out: Path
    concurrency: int = 1
    redo: frozenset[str] = frozenset()  # statuses evaluated again on resume (besides errors): after a scorer fix, say

    def __post_init__(self) -> None:
        self._generation_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._stopping = threading.Event()

    def run(self, problems: list[Problem], progress: Progress | None = None) -> list[dict[str, Any]]:
        """Evaluate what is missing; return every record of these problems (old and new)."""
        self.out.mkdir(parents=True, exist_ok=True)
        drop_partial_line(self.out / SAMPLES_FILE)
        done = {
            (r["problem"], r["sample"]) for r in load_records(self.out) if r["status"] != ERROR and r["status"] not in self.redo
        }
        todo = {p.id: [i for i in range(self.samples) if (p.id, i) not in done] for p in problems}
        with progress or _progress() as bar:
            task = bar.add_task(
                "evaluating", total=len(problems) * self.samples, completed=sum(self.samples - len(m) for m in todo.values())
            )
            executor = ThreadPoolExecutor(max_workers=self.concurrency)
            try:
                running = {executor.submit(self._evaluate, p, todo[p.id]): p for p in problems if todo[p.id]}
                for future in as_completed(running):
                    future.result()
                    problem = running[future]
                    bar.update(task, description=problem.id, advance=len(todo[problem.id]))
            except BaseException:  # a Ctrl-C above all
                # Samples being scored now are not written (their children are about to be stopped,
                # so their verdicts would be wrong): the next run does them. Set under the write
                # lock, so no append is half done once this returns.
                with self._write_lock:
                    self._stopping.set()
                executor.shutdown(wait=False, cancel_futures=True)
                raise
            executor.shutdown()
        ids = {p.id for p in problems}
        return [r for r in load_records(self.out) if r["problem"] in ids and r["sample"] < self.samples]

    def _evaluate(self, problem: Problem, indices: list[int]) -> None:
        started = time.perf_counter()
        module = problem.path.read_text()
        generation_s = evaluation_s = 0.0
        try:
            t0 = time.perf_counter()  # a wait for the generator counts as generation, not as harness overhead
            with contextlib.nullcontext() if getattr(self.generator, "thread_safe", False) else self._generation_lock:
                sampling = self.sampling.model_copy(update={"n": len(indices)})
                drafts = self.generator.generate(module, self.backend, sampling)[: len(indices)]
                generation_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            reports, _ = score_drafts(module, drafts, self.scorer, self.options)
            evaluation_s = time.perf_counter() - t0
        except ProcessUnfit:  # this process's CUDA context is lost: every later problem would fail too
            raise
        except Exception as exc:  # an endpoint down, a generator bug: recorded, and retried by the next run
            outcomes = [{**_outcome(None, self.generator.name), "status": ERROR, "reason": f"{type(exc).__name__}: {exc}"}] * len(
                indices
            )
        else:
            # A generator returns up to n drafts; one that has fewer to give (the deterministic
            # template has exactly one) is drawn again: later samples reuse its drafts in turn.
            outcomes = [
                _outcome(reports[position % len(reports)] if reports else None, self.generator.name)
                for position in range(len(indices))
            ]
        per_sample = {"generation_s": generation_s / len(indices), "evaluation_s": evaluation_s / len(indices)}
        records = [
            {"problem": problem.id, "level": problem.level, "sample": index, **outcome, **per_sample}
            for index, outcome in zip(indices, outcomes)
        ]
        overhead_s = (time.perf_counter() - started - generation_s - evaluation_s) / len(indices)
        lines = [json.dumps({**r, "overhead_s": overhead_s}) for r in records]
        with self._write_lock:
            if self._stopping.is_set():
                return
            with (self.out / SAMPLES_FILE).open("a") as f:
                f.write("".join(line + "\n" for line in lines))


def _outcome(report: CandidateReport | None, generator_name: str) -> dict[str, Any]:
    verdict = report.verdict if report else None
    if report is None:
        status, reason = "declined", "the generator returned no draft"
    elif verdict is None:
        status, reason = "declined", report.declined or "no code in the reply"
    else:
        status, reason = verdict.status, verdict.reason
    return {
        "model": report.model if report else generator_name,
        "draft": report.index if report else None,
        "status": status,
        "correct": bool(verdict and verdict.correct),
        "reason": reason,
        "speedup": verdict.speedup if verdict else None,
        "runtime_ms": verdict.runtime_ms if verdict else None,
        "ref_runtime_ms": verdict.ref_runtime_ms if verdict else None,
        "device": verdict.device if verdict else None,
        "kernel": report.source if report else None,
        # where the reward service's time went (children, judge, waits, phases): what a slow problem is read from
        "seconds": verdict.details.get("seconds") if verdict else None,
        "phases": verdict.details.get("phases") if verdict else None,
    }


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
    )

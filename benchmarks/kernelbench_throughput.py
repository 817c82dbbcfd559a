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

Steps:
  prepare  write the template generator's candidates for a problem directory (CPU is fine)
  run      time both evaluators and write ``kernelbench_throughput.json`` to ``--out``

    python benchmarks/kernelbench_throughput.py prepare --problems KB/level1 --candidates .bench/cands
    python benchmarks/kernelbench_throughput.py run --problems KB/level1 --candidates .bench/cands \
        --kernelbench /path/to/KernelBench --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import statistics
import sys
import tempfile
import time
import types
from concurrent.futures import ThreadPoolExecutor, as_completed
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import track
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
console = Console()
KB_TIMEOUT_S = 180


def prepare(problems: Path, candidates: Path, limit: int) -> None:
    from coder_svc.models.base import Sampling
    from coder_svc.template import TemplateGenerator

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


def pairs(problems: Path, candidates: Path) -> list[tuple[str, str, str]]:
    return [(c.name, (problems / c.name).read_text(), c.read_text()) for c in sorted(candidates.glob("*.py")) if (problems / c.name).exists()]


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
            original_model_src=reference, custom_model_src=candidate, measure_performance=True, timing_method="cuda_event",
            num_correct_trials=5, num_perf_trials=100, build_dir=build_dir, device=torch.device("cuda:0"), backend="triton",
            precision=torch.float32,
        )
    except Exception as exc:  # their wrapper's last-level catch
        return {"compiled": False, "correct": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
    if result is None:
        return {"compiled": False, "correct": False, "error": "no result"}
    return {"compiled": bool(result.compiled), "correct": bool(result.correctness), "runtime_us": result.runtime,
            "ref_runtime_us": getattr(result, "ref_runtime", None)}


def _checkpoint(rows: list[dict[str, Any]], partial: Path) -> None:
    """Rows so far, so a run cut short by a time limit still leaves its figures."""
    partial.write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def run_kernelbench(work: list[tuple[str, str, str]], kernelbench: Path, partial: Path) -> dict[str, Any]:
    """One sample after the other, as their script does on one GPU; resumes from ``partial``, so a
    set longer than one device call is timed over several (the rate is over the rows' wall times)."""
    context = mp.get_context("spawn")
    names = {w[0] for w in work}
    rows = [r for r in _load_rows(partial) if r["problem"] in names]
    done = {r["problem"] for r in rows}
    with tempfile.TemporaryDirectory() as build_root:
        for name, reference, candidate in track([w for w in work if w[0] not in done], description="KernelBench eval", console=console):
            t0 = time.perf_counter()
            with context.Pool(1) as pool:
                try:
                    row = pool.apply_async(_kb_eval_one, (str(kernelbench), reference, candidate, f"{build_root}/{name}")).get(timeout=KB_TIMEOUT_S)
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


def run_ours(work: list[tuple[str, str, str]], partial: Path, concurrency: int) -> dict[str, Any]:
    """``concurrency`` groups in flight, as a GPU reward worker's threads pool runs its jobs."""
    from reward_svc.evaluate import EvalOptions, Evaluator, warm_children

    evaluator = Evaluator()
    options = EvalOptions(backend="triton", device="cuda")
    pool = evaluator.pool("cuda", options.timeout_s)
    warmed = pool.wait_ready(timeout_s=300)
    rows: list[dict[str, Any]] = []

    def evaluate_one(name: str, reference: str, candidate: str) -> dict[str, Any]:
        t0 = time.perf_counter()
        verdict = evaluator.evaluate_group(reference, [candidate], options).verdicts[0]
        return {"problem": name, "wall_s": round(time.perf_counter() - t0, 3), "status": verdict.status, "correct": verdict.correct,
                "speedup": verdict.speedup, "reason": verdict.reason[:200], "seconds": verdict.details.get("seconds"),
                "phases": verdict.details.get("phases")}

    started = time.perf_counter()
    try:
        with ThreadPoolExecutor(max_workers=concurrency) as executor:
            futures = [executor.submit(evaluate_one, *w) for w in work]
            for future in track(as_completed(futures), total=len(futures), description="KernelZero eval", console=console):
                rows.append(future.result())
                _checkpoint(rows, partial)
    finally:
        evaluator.close()
    summary = _summary(rows, time.perf_counter() - started)
    summary.update(concurrency=concurrency, warm_children=warm_children(evaluator.settings, "cuda"), pool_warm_at_start=warmed)
    return summary


def _summary(rows: list[dict[str, Any]], total_s: float) -> dict[str, Any]:
    walls = [r["wall_s"] for r in rows]
    return {"candidates": len(rows), "total_s": round(total_s, 2), "candidates_per_min": round(60 * len(rows) / total_s, 2) if total_s else None,
            "p50_s": round(statistics.median(walls), 3) if walls else None, "correct": sum(bool(r.get("correct")) for r in rows), "rows": rows}


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
    args = parser.parse_args()
    if args.step == "prepare":
        prepare(args.problems, args.candidates, args.limit)
        return
    work = pairs(args.problems, args.candidates)[: args.limit]
    import torch

    report: dict[str, Any] = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                              "machine": {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "python": platform.python_version(),
                                          "cpus": mp.cpu_count()},
                              "problems": len(work)}
    args.out.mkdir(parents=True, exist_ok=True)
    if args.only != "kernelbench":
        from services.config import get_settings

        report["ours"] = run_ours(work, args.out / "ours_rows.jsonl", args.concurrency or get_settings().reward_gpu_concurrency)
    if args.only != "ours":
        report["kernelbench"] = run_kernelbench(work, args.kernelbench, args.out / "kernelbench_rows.jsonl")
    if "ours" in report and "kernelbench" in report:
        report["throughput_ratio"] = round(report["ours"]["candidates_per_min"] / report["kernelbench"]["candidates_per_min"], 2)
        theirs = {r["problem"]: r["correct"] for r in report["kernelbench"]["rows"]}
        report["agreement"] = sum(r["correct"] == theirs.get(r["problem"]) for r in report["ours"]["rows"])
    (args.out / f"kernelbench_throughput{'_' + args.only if args.only else ''}.json").write_text(json.dumps(report, indent=1))
    table = Table(title=f"{len(work)} KernelBench problems, template Triton candidates")
    for column in ("evaluator", "candidates/min", "p50 s", "correct"):
        table.add_column(column)
    for side in ("ours", "kernelbench"):
        if side in report:
            s = report[side]
            table.add_row(side, str(s["candidates_per_min"]), str(s["p50_s"]), f"{s['correct']}/{s['candidates']}")
    console.print(table)
    if "throughput_ratio" in report:
        console.print(f"throughput ratio {report['throughput_ratio']}x; verdicts agree on {report['agreement']}/{len(work)}")


if __name__ == "__main__":
    main()

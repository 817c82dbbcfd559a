"""Which KernelBench problems the template generator writes a kernel for, and why it declines the rest.

Each problem is traced in the sandbox (on the 'meta' device: no memory for KernelBench's big
shapes) and run through fusion and code generation; correctness is not judged here (that needs the
reward service, best on a GPU). The rule-based generator is deterministic, so one pass is the
whole answer.

With ``--check-cpu N ...`` the generated kernels of those problems (by number, of the first level
given; ``all``: every generated one of every level given) are also judged by the reward service on
this CPU under the Triton interpreter, with the module's integer size constants shrunk to at most 48
so the interpreter finishes: the CPU's view of whether a change to the judge rejects an honest kernel.

Usage: .venv/bin/python benchmarks/template_coverage.py [--root /work/kernelbench/KernelBench] [--levels 1 2] [--workers 2]
       [--check-cpu 19 23 47 | --check-cpu all] [--out FILE]
Writes benchmarks/results/template_coverage_cpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from coder_svc.template import TemplateGenerator  # noqa: E402
from coder_svc.template.codegen import VERSION  # noqa: E402
from services.llm.chat import Sampling  # noqa: E402

RESULT = Path(__file__).resolve().parent / "results" / "template_coverage_cpu.json"


def category(reason: str) -> str:
    """Declines grouped by cause: 'no fusable op' keeps the ops it saw, others their first clause."""
    if reason.startswith("no fusable op"):
        return reason
    return reason.split(":")[0] + (": " + reason.split(":")[1].strip()[:60] if reason.startswith("trace failed") else "")


def run_one(generator: TemplateGenerator, path: Path) -> dict[str, Any]:
    start = time.monotonic()
    draft = generator.generate(path.read_text(), "triton", Sampling())[0]
    entry: dict[str, Any] = {"problem": path.name, "seconds": round(time.monotonic() - start, 2)}
    if draft.source is None:
        entry.update(status="declined", reason=draft.declined)
    else:
        entry.update(status="generated", kernels=draft.details.get("kernels"), pytorch_ops=draft.details.get("pytorch_ops"))
    return entry


def shrink(source: str, limit: int = 48) -> str:
    """Module-level integer constants (KernelBench's sizes) capped at ``limit``."""
    return re.sub(r"^(\w+)\s*=\s*(\d+)\s*(#.*)?$", lambda m: f"{m[1]} = {min(int(m[2]), limit)}", source, flags=re.M)


def check_cpu(generator: TemplateGenerator, paths: list[Path], console: Console) -> list[dict[str, Any]]:
    from reward_svc.evaluate import Evaluator
    from services.schemas.reward import ScoreOptions

    evaluator = Evaluator()
    checked = []
    try:
        for path in paths:
            source = shrink(path.read_text())
            draft = generator.generate(source, "triton", Sampling())[0]
            if draft.source is None:
                checked.append({"problem": path.name, "status": "declined", "reason": draft.declined})
                continue
            verdict = evaluator.evaluate_group(
                source, [draft.source], ScoreOptions(backend="triton", device="cpu", timeout_s=600)
            ).verdicts[0]
            checked.append({"problem": path.name, "status": verdict.status, "reason": verdict.reason})
            console.print(f"{path.name}: {verdict.status} ({verdict.reason[:100]})")
    finally:
        evaluator.close()
    return checked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("/work/kernelbench/KernelBench"))
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULT)
    parser.add_argument("--check-cpu", nargs="*", default=[], help="problem numbers of the first level, or 'all'")
    args = parser.parse_args()

    generator = TemplateGenerator()
    console = Console()
    levels: dict[str, Any] = {}

    def write() -> None:  # after every level, so a long run keeps what it measured
        result = {
            "generator": "template",
            "version": VERSION,
            "measured": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "load_1min": os.getloadavg()[0]},
            "note": "generated vs declined only; correctness and speed are measured on the GPU by the reward service",
            "levels": levels,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")

    for level in args.levels:
        problems = sorted((args.root / f"level{level}").glob("*.py"), key=lambda p: int(p.name.split("_")[0]))
        with Progress(console=console) as progress, ThreadPoolExecutor(args.workers) as pool:
            task = progress.add_task(f"level {level}", total=len(problems))
            entries = []
            for entry in pool.map(lambda p: run_one(generator, p), problems):
                entries.append(entry)
                progress.advance(task)
        generated = [e for e in entries if e["status"] == "generated"]
        declined = Counter(category(e["reason"]) for e in entries if e["status"] == "declined")
        levels[f"level{level}"] = {
            "problems": len(entries),
            "generated": len(generated),
            "declined": len(entries) - len(generated),
            "declined_by_reason": dict(declined.most_common()),
            "entries": entries,
        }
        table = Table(title=f"level {level}: {len(generated)}/{len(entries)} generated")
        table.add_column("declined because")
        table.add_column("problems", justify="right")
        for reason, count in declined.most_common():
            table.add_row(reason, str(count))
        console.print(table)
        write()
    if args.check_cpu == ["all"]:
        for level in args.levels:
            entries = levels[f"level{level}"]["entries"]
            paths = [args.root / f"level{level}" / e["problem"] for e in entries if e["status"] == "generated"]
            levels[f"level{level}"]["cpu_check_shrunk_shapes"] = check_cpu(generator, paths, console)
            write()
    elif args.check_cpu:
        by_number = {int(p.name.split("_")[0]): p for p in (args.root / f"level{args.levels[0]}").glob("*.py")}
        checked = check_cpu(generator, [by_number[int(n)] for n in args.check_cpu], console)
        levels[f"level{args.levels[0]}"]["cpu_check_shrunk_shapes"] = checked
        write()
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
